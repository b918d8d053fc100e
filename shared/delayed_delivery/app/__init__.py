"""The applications built on the library: the command line, operator routes, the demo, local emulators."""
