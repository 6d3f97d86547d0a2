"""The official openai SDK, unmodified, against a running tailcut (tests/sdk/sdk.toml).

With TAILCUT_API_KEY set (.ci/run serves sdk.toml with [auth] and a fresh key), the key is
the SDK's api_key, and the refusals are checked too: a wrong key, a foreign tenant.
"""
import json
import os
import sys

import openai

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:18080/v1"
API_KEY = os.environ.get("TAILCUT_API_KEY")
client = openai.OpenAI(base_url=BASE, api_key=API_KEY or "unused", max_retries=0, timeout=30)
failures = []
CHECKS = 0


def check(name, fn):
    global CHECKS
    CHECKS += 1
    try:
        fn()
        print(f"ok   {name}")
    except Exception as e:  # noqa: BLE001 - report every failing check
        failures.append(name)
        print(f"FAIL {name}: {type(e).__name__}: {e}")


def streams_text(model):
    def run():
        stream = client.chat.completions.create(
            model=model, stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "hi"}])
        text, usage, finish = "", None, None
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        assert text == "Hello from tailcut through the official SDK.", repr(text)
        assert finish == "stop", finish
        assert usage is not None and usage.completion_tokens > 0, usage
    return run


def non_streaming():
    r = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "Hello from tailcut through the official SDK.", r
    assert r.model == "sim-quick-openai", r.model


def tool_call(model):
    def run():
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}}}]
        stream = client.chat.completions.create(
            model=model, stream=True, tools=tools, messages=[{"role": "user", "content": "weather?"}])
        calls = {}
        finish = None
        for chunk in stream:
            for c in chunk.choices:
                finish = c.finish_reason or finish
                for tc in c.delta.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"name": "", "args": ""})
                    slot["name"] += (tc.function.name or "") if tc.function else ""
                    slot["args"] += (tc.function.arguments or "") if tc.function else ""
        assert finish == "tool_calls", finish
        assert len(calls) == 1, calls
        assert calls[0]["name"] == "get_weather", calls
        assert json.loads(calls[0]["args"]) == {"city": "Paris", "unit": "celsius"}, calls
    return run


def unknown_model_is_not_found():
    try:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    except openai.NotFoundError as e:
        assert "chat" in str(e), e
        return
    raise AssertionError("expected NotFoundError")


def rate_limited_is_rate_limit_error():
    try:
        client.chat.completions.create(model="limited", stream=True, messages=[{"role": "user", "content": "hi"}])
    except openai.RateLimitError as e:
        assert e.response.headers.get("retry-after"), e.response.headers
        return
    raise AssertionError("expected RateLimitError")


def truncation_is_an_exception():
    stream = client.chat.completions.create(model="broken", stream=True, messages=[{"role": "user", "content": "hi"}])
    got = ""
    try:
        for chunk in stream:
            for c in chunk.choices:
                got += c.delta.content or ""
    except openai.APIError as e:
        assert got, "some text arrived before the failure"
        assert "truncated" in str(e).lower() or "interrupted" in str(e).lower() or e.message, e
        return
    raise AssertionError(f"a truncated stream ended like a complete one: {got!r}")


def wrong_key_is_authentication_error():
    wrong = openai.OpenAI(base_url=BASE, api_key="tc_not-a-key", max_retries=0, timeout=30)
    try:
        wrong.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}])
    except openai.AuthenticationError as e:
        assert "tc_not-a-key" not in str(e), e
        return
    raise AssertionError("expected AuthenticationError")


def foreign_tenant_is_permission_denied():
    try:
        client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-tailcut-tenant": "someone-else"})
    except openai.PermissionDeniedError:
        return
    raise AssertionError("expected PermissionDeniedError")


def models_are_listed_for_the_key():
    ids = [m.id for m in client.models.list()]
    assert "chat" in ids, ids


def logprobs_ride_on_their_text():
    msgs = [{"role": "user", "content": "hi"}]
    whole = client.chat.completions.create(model="chat", logprobs=True, top_logprobs=2, messages=msgs)
    tokens = whole.choices[0].logprobs.content
    assert "".join(t.token for t in tokens) == whole.choices[0].message.content, tokens
    assert all(len(t.top_logprobs) == 2 for t in tokens), tokens
    assert whole.system_fingerprint and whole.system_fingerprint.startswith("fp_"), whole
    text, listed = "", ""
    for chunk in client.chat.completions.create(model="chat", stream=True, logprobs=True, messages=msgs):
        for c in chunk.choices:
            text += c.delta.content or ""
            listed += "".join(t.token for t in (c.logprobs.content or [])) if c.logprobs else ""
    assert listed == text, (listed, text)


def reasoning_model_takes_max_completion_tokens():
    m = client.chat.completions.create(
        model="reasoning", max_completion_tokens=200, reasoning_effort="low",
        messages=[{"role": "user", "content": "hi"}])
    assert m.choices[0].message.content, m
    assert m.usage.completion_tokens_details.reasoning_tokens > 0, m.usage


def reasoning_content_streams_before_the_text():
    reasoning, text, order = "", "", []
    for chunk in client.chat.completions.create(
            model="reasoner", stream=True, messages=[{"role": "user", "content": "hi"}]):
        for c in chunk.choices:
            extra = (c.delta.model_extra or {}).get("reasoning_content")
            if extra:
                reasoning += extra
                order.append("r")
            if c.delta.content:
                text += c.delta.content
                order.append("t")
    assert reasoning and text == "Hello from tailcut through the official SDK.", (reasoning, text)
    assert order.index("r") < order.index("t"), order


def streamed_usage_keeps_its_details():
    usage = None
    for chunk in client.chat.completions.create(
            model="reasoning", stream=True, stream_options={"include_usage": True},
            max_completion_tokens=200, messages=[{"role": "user", "content": "hi"}]):
        usage = chunk.usage or usage
    assert usage and usage.completion_tokens_details.reasoning_tokens > 0, usage


def a_refusal_is_the_refusal_field():
    m = client.chat.completions.create(model="refusing", messages=[{"role": "user", "content": "hi"}])
    choice = m.choices[0]
    assert choice.message.refusal and choice.message.content is None, choice
    assert choice.finish_reason == "stop", choice.finish_reason
    refusal = ""
    for chunk in client.chat.completions.create(
            model="refusing", stream=True, messages=[{"role": "user", "content": "hi"}]):
        for c in chunk.choices:
            refusal += c.delta.refusal or ""
            assert not c.delta.content, c.delta
    assert refusal == choice.message.refusal, (refusal, choice.message.refusal)


def a_pdf_file_part_reaches_an_openai_route():
    pdf = "data:application/pdf;base64,JVBERi0xLjQKJeLjz9MKMSAwIG9iago8PD4+CmVuZG9iagp0cmFpbGVyCjw8Pj4KJSVFT0YK"
    m = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": [
        {"type": "file", "file": {"filename": "note.pdf", "file_data": pdf}},
        {"type": "text", "text": "Summarise it."}]}])
    assert m.choices[0].message.content, m


def reasoning_effort_is_mapped_to_an_anthropic_route():
    m = client.chat.completions.create(
        model="chat-anthropic", reasoning_effort="low", max_completion_tokens=2048,
        messages=[{"role": "user", "content": "hi"}])
    extra = m.choices[0].message.model_extra or {}
    assert extra.get("reasoning_content"), m.choices[0].message
    assert m.choices[0].message.content == "Hello from tailcut through the official SDK.", m


def logprobs_need_an_openai_route():
    try:
        client.chat.completions.create(model="chat-anthropic", logprobs=True,
                                       messages=[{"role": "user", "content": "hi"}])
    except openai.BadRequestError as e:
        assert "logprobs" in str(e), e
        return
    raise AssertionError("an Anthropic route answered without the logprobs asked for")


def a_model_is_described():
    m = client.models.retrieve("chat")
    assert m.id == "chat", m


check("logprobs ride on their text, streamed and whole", logprobs_ride_on_their_text)
check("a reasoning model gets max_completion_tokens and reports reasoning tokens",
      reasoning_model_takes_max_completion_tokens)
check("reasoning_content streams before the text", reasoning_content_streams_before_the_text)
check("models.retrieve describes one model", a_model_is_described)
check("streamed usage keeps its details", streamed_usage_keeps_its_details)
check("an OpenAI route's refusal is the refusal field, streamed and whole", a_refusal_is_the_refusal_field)
check("a PDF file part reaches an OpenAI route", a_pdf_file_part_reaches_an_openai_route)
check("reasoning_effort is mapped to an Anthropic route's thinking", reasoning_effort_is_mapped_to_an_anthropic_route)
check("logprobs to an Anthropic-only model -> BadRequestError naming them", logprobs_need_an_openai_route)
check("openai route streams text and usage", streams_text("chat"))
check("anthropic route streams text to the openai SDK", streams_text("chat-anthropic"))
check("non-streaming completion", non_streaming)
check("tool call arrives whole (openai route)", tool_call("tools"))
check("tool call arrives whole (anthropic route)", tool_call("tools-anthropic"))
check("restart before anything visible is invisible", tool_call("tools-flaky"))
check("unknown model -> NotFoundError", unknown_model_is_not_found)
check("all routes 429 -> RateLimitError with retry-after", rate_limited_is_rate_limit_error)
check("mid-stream truncate -> APIError, not a normal end", truncation_is_an_exception)
if API_KEY:
    check("wrong key -> AuthenticationError (401)", wrong_key_is_authentication_error)
    check("another tenant -> PermissionDeniedError (403)", foreign_tenant_is_permission_denied)
    check("models are listed with the key", models_are_listed_for_the_key)

print(f"openai SDK checks: {CHECKS - len(failures)} ok, {len(failures)} failing")
sys.exit(1 if failures else 0)
