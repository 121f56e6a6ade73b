"""Scripts that measure the library and the service and print JSON (README.md lists them);
``results/`` keeps the figures of past runs as data."""
