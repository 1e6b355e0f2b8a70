"""Images and videos as a row brings them: read, checked and resized for the processor."""
