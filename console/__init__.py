"""The operator console: static HTML, CSS and JS of our own, served by the function app at /api/console."""
