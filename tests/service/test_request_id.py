"""Every answer names its request (``X-Request-ID``), and so do the log lines written for it."""

from __future__ import annotations

import logging

import httpx
import pytest
from pydantic import SecretStr

from service.api.app import create_app
from service.api.request_id import RequestIdLogFilter, current_request_id
from service.settings import Settings


async def test_every_answer_carries_its_own_new_id(client: httpx.AsyncClient):
    answers = [await client.get("/healthz"), await client.get("/healthz"),
               await client.get("/v1/models/absent")]
    ids = [r.headers["x-request-id"] for r in answers]
    assert answers[2].status_code == 404
    assert len(set(ids)) == 3 and all(ids)


@pytest.mark.parametrize("given", ["checkout-7f3a", "0af7651916cd43dd8448eb211c80319c",
                                   "lb/2026-11-25T10:00:00Z+1@edge.example"])
async def test_a_clients_id_comes_back_as_sent(client: httpx.AsyncClient, given: str):
    r = await client.get("/healthz", headers={"x-request-id": given})
    assert r.headers["x-request-id"] == given


@pytest.mark.parametrize("given", ["two words", "x" * 129, 'quote"d', "semi;colon", ""])
async def test_an_id_unfit_for_a_header_or_a_log_line_is_replaced(
    client: httpx.AsyncClient, given: str
):
    r = await client.get("/healthz", headers={"x-request-id": given})
    assert r.headers["x-request-id"] not in ("", given)


async def test_answers_of_the_guards_carry_an_id_too(settings: Settings, serve):
    app = create_app(settings.model_copy(update={"api_token": SecretStr("s3cret"),
                                                 "max_body_bytes": 64}))
    async with serve(app) as client:
        refused = await client.post("/v1/models", json={"name": "m"},
                                    headers={"x-request-id": "no-token"})
        too_big = await client.post("/v1/models", content=b"{" + b" " * 100 + b"}", headers={
            "authorization": "Bearer s3cret", "content-type": "application/json"})
    assert refused.status_code == 401 and refused.headers["x-request-id"] == "no-token"
    assert too_big.status_code == 413 and too_big.headers["x-request-id"]


async def test_log_lines_written_for_a_request_name_its_id(client: httpx.AsyncClient,
                                                           create_model):
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    handler.addFilter(RequestIdLogFilter())
    logger = logging.getLogger("service")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        await create_model(client, "m", headers={"x-request-id": "create-m-1"})
        logging.getLogger("service.test").info("outside any request")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    created = [r for r in records if "created model 'm'" in r.getMessage()]
    assert [(r.request_id, r.request_tag) for r in created] == [("create-m-1", " [create-m-1]")]
    outside = [r for r in records if r.getMessage() == "outside any request"]
    assert [(r.request_id, r.request_tag) for r in outside] == [("-", "")]
    assert current_request_id.get() == "-"
