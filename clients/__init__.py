"""xaudit clients: the typed Python client library and the ``xaudit`` command line."""
