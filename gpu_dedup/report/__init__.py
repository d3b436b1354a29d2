"""The run report: ``report.json`` (build), ``report.html`` (html) and the figures (plots)."""
