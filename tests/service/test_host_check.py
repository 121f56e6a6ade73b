"""A server on the loopback interface answers only to local host names (DNS rebinding)."""

from __future__ import annotations

import pytest

from service.api.app import create_app
from service.api.host_check import allowed_hosts_for, host_name
from service.settings import Settings


@pytest.mark.parametrize(("header", "name"), [
    ("localhost:8000", "localhost"), ("LOCALHOST", "localhost"), ("127.0.0.1:80", "127.0.0.1"),
    ("[::1]:8000", "::1"), ("[::1]", "::1"), ("::1", "::1"), ("evil.example:8000", "evil.example"),
    ("[::1]evil.example", "[::1]evil.example"),  # not a bracketed address: matches nothing
])
def test_the_host_name_is_the_header_without_its_port(header: str, name: str):
    assert host_name(header) == name


def test_the_default_follows_the_address_listened_on():
    local = ["localhost", "127.0.0.1", "::1"]
    assert allowed_hosts_for("127.0.0.1", None) == local
    assert allowed_hosts_for("::1", None) == local
    assert allowed_hosts_for("localhost", None) == local
    assert allowed_hosts_for("0.0.0.0", None) is None  # a container: any host
    assert allowed_hosts_for("10.0.0.5", None) is None
    assert allowed_hosts_for("127.0.0.1", ["GLN.example.com", "localhost"]) == [
        "gln.example.com", "localhost"]
    assert allowed_hosts_for("127.0.0.1", ["*"]) is None
    assert allowed_hosts_for("0.0.0.0", ["myhost:8000"]) == ["myhost"]  # ports do not count
    assert Settings(allowed_hosts=" a.example , b ").allowed_host_names == ["a.example", "b"]


async def test_a_page_that_rebinds_its_name_to_the_loopback_server_is_refused(
    settings: Settings, serve, create_model, small_config
):
    async with serve(create_app(settings)) as client:  # listens on 127.0.0.1 by default
        await create_model(client)
        for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example"):
            r = await client.post("/v1/models", headers={"host": host},
                                  json={"name": "planted", "config": small_config})
            assert r.status_code == 400, host
            assert "GLN_ALLOWED_HOSTS" in r.json()["detail"]
            assert (await client.get("/v1/models/m", headers={"host": host})).status_code == 400
        for host in ("localhost:8000", "127.0.0.1", "[::1]:8000"):
            assert (await client.get("/v1/models/m", headers={"host": host})).status_code == 200
        assert [m["name"] for m in (await client.get("/v1/models")).json()] == ["m"]
    anywhere = settings.model_copy(update={"allowed_hosts": "gln.example.com"})
    async with serve(create_app(anywhere)) as client:
        for host, status in (("gln.example.com", 200), ("localhost", 400)):
            assert (await client.get("/healthz", headers={"host": host})).status_code == status
