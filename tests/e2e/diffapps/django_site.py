"""A Django project in one file, served by cyserve and by the reference servers alike (uvicorn
for its ASGI handler, gunicorn for its WSGI one: tests/e2e/test_frameworks_uvicorn_diff.py and
test_wsgi_gunicorn_diff.py): an async view, a sync one, a 404, a CSRF rejection, a 500, an upload,
a streamed answer and a file."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from typing import Any

import django
from django.conf import settings
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.http import StreamingHttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

settings.configure(
    DEBUG=False,
    SECRET_KEY="a key for the differential tests only",
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    MIDDLEWARE=["django.middleware.common.CommonMiddleware",
                "django.middleware.csrf.CsrfViewMiddleware"],
    INSTALLED_APPS=[],
    USE_TZ=True,
    APPEND_SLASH=True,
    LOGGING_CONFIG=None,
    DATA_UPLOAD_MAX_MEMORY_SIZE=None,
)
django.setup()


async def hello(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"path": request.path, "method": request.method,
                         "query": dict(request.GET.lists()),
                         "script_name": request.META.get("SCRIPT_NAME"),
                         "path_info": request.path_info})


def sync_view(request: HttpRequest, name: str) -> HttpResponse:
    return JsonResponse({"name": name, "q": request.GET.get("q")})


def form(request: HttpRequest) -> HttpResponse:
    # CSRF-protected: a POST without the cookie and token is refused by the middleware.
    return HttpResponse("posted")


@csrf_exempt
def echo(request: HttpRequest) -> HttpResponse:
    body = request.body
    return JsonResponse({"len": len(body), "sha256": hashlib.sha256(body).hexdigest(),
                         "content_type": request.content_type,
                         "json": json.loads(body) if request.content_type == "application/json"
                         else None})


@csrf_exempt
def upload(request: HttpRequest) -> HttpResponse:
    f = request.FILES["file"]
    data = f.read()
    return JsonResponse({"name": f.name, "size": len(data),
                         "sha256": hashlib.sha256(data).hexdigest(),
                         "field": request.POST.get("field")})


def stream(request: HttpRequest) -> HttpResponse:
    def pieces() -> Iterator[bytes]:
        for i in range(4):
            yield b"line %d\n" % i

    return StreamingHttpResponse(pieces(), content_type="text/plain")


def a_file(request: HttpRequest) -> Any:
    return FileResponse(open(os.environ["DIFFAPP_FILE"], "rb"),  # noqa: SIM115 (closed by Django)
                        content_type="application/octet-stream")


def boom(request: HttpRequest) -> HttpResponse:
    raise ValueError("the view failed")


def latin1(request: HttpRequest) -> HttpResponse:
    r = HttpResponse("a header outside ASCII")
    r["X-Name"] = "caf\u00e9"
    return r


urlpatterns = [
    path("hello/", hello),
    path("names/<str:name>", sync_view),
    path("form/", form),
    path("echo/", echo),
    path("upload/", upload),
    path("stream/", stream),
    path("file/", a_file),
    path("boom/", boom),
    path("latin1/", latin1),
]


def asgi() -> Any:
    from django.core.asgi import get_asgi_application
    return get_asgi_application()


def wsgi() -> Any:
    from django.core.wsgi import get_wsgi_application
    return get_wsgi_application()
