"""A rank's model: building and loading it (rank 0 or sharded), precision, the vision
tower's passes, gathering full parameters, and the rank's model and optimizer state."""
