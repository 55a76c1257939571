"""The gRPC front end of xaudit: validation, job store, blob store, dispatch to Celery, servicers."""
