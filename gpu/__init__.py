"""The torch implementation of the scheduler: to come in the next issues."""
