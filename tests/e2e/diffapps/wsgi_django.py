"""Django's WSGI handler for the differential test against gunicorn (django_site.py)."""

from django_site import wsgi

app = wsgi()
