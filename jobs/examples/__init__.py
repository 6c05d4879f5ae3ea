"""The shipped example: the page-view transform and the sample data `make demo` produces."""
