"""Scripts that measure the library and the service; they print JSON and never run in tests."""
