"""Django's ASGI handler for the differential test against uvicorn (django_site.py)."""

from django_site import asgi

app = asgi()
