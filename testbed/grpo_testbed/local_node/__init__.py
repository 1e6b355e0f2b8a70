"""A node of the testbed whose pods really run, as local processes."""
