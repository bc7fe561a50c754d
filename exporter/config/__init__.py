"""The exporter's configuration: settings, the fleet file, file_sd, flags, reserved labels, start-up
warnings."""
