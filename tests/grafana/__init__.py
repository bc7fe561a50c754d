"""The dashboards, rule files and provisioning, with promtool and the Grafana schema."""
