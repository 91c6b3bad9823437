"""The application: the typed configuration (`config`), the wiring that builds the controller and
its parts from it (`wiring`), and running it on a real or the simulated cluster (`run`). The CLI
parses arguments and calls this; nothing below imports it."""
