"""The OpenAPI page (``/docs``) served with its own copy of Swagger UI, so that it works on a
machine without internet access (FastAPI's default loads it from a CDN and shows a blank page
offline). The assets come from the ``swagger-ui-bundle`` package."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

ASSETS = "/docs/assets"


def add_docs_page(app: FastAPI) -> None:
    """``/docs`` and its assets under :data:`ASSETS`, from the installed bundle."""
    app.mount(ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} - API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        )

    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)
