"""The idempotency key cost benchmark end to end with a few thousand keys, on both logs."""

import json

import redis

from benchmarks import idempotency_keys


def test_it_measures_both_logs_and_leaves_no_key_behind(capsys, redis_url):
    client = redis.Redis.from_url(redis_url)
    before = set(client.scan_iter(match="bench-idempotency-*", count=1000))
    result = idempotency_keys.main(["--keys", "2500", "--redis-url", redis_url])
    assert json.loads(capsys.readouterr().out) == result
    file_log = result["file_log"]
    # Every key and its 64-character digest are in the base record a trim writes.
    assert file_log["base_record_mb"] * 1e6 >= 2500 * (64 + len("request-000000000000"))
    assert file_log["trim_s"] > 0 and file_log["reopen_s"] > 0
    assert result["redis_log"]["delete_s"] > 0
    assert set(client.scan_iter(match="bench-idempotency-*", count=1000)) == before
