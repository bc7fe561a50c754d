"""The alerts: their specs and words, the alert book, delivery to Alertmanager, fleet rules."""
