"""What speaks a framework to run an update, one folder per backend (tensorflow/)."""
