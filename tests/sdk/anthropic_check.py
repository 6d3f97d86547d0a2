"""The official anthropic SDK, unmodified, against a running tailcut (tests/sdk/sdk.toml).

With TAILCUT_API_KEY set (.ci/run serves sdk.toml with [auth] and a fresh key), the key is
the SDK's api_key (sent as x-api-key), and the refusals are checked too.
"""
import json
import os
import sys

import anthropic

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:18080"
API_KEY = os.environ.get("TAILCUT_API_KEY")
client = anthropic.Anthropic(base_url=BASE, api_key=API_KEY or "unused", max_retries=0, timeout=30)
failures = []
total = 0
TEXT = "Hello from tailcut through the official SDK."
HI = [{"role": "user", "content": "hi"}]


def check(name, fn):
    global total
    total += 1
    try:
        fn()
        print(f"ok   {name}")
    except Exception as e:  # noqa: BLE001 - report every failing check
        failures.append(name)
        print(f"FAIL {name}: {type(e).__name__}: {e}")


def streams_text(model):
    def run():
        with client.messages.stream(model=model, max_tokens=256, system="Be brief.", messages=HI) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert text == TEXT, repr(text)
        assert final.stop_reason == "end_turn", final.stop_reason
        assert final.content[0].text == TEXT, final.content
        assert final.usage.output_tokens > 0, final.usage
    return run


def raw_events_are_typed():
    kinds = [e.type for e in client.messages.create(model="chat", max_tokens=64, stream=True, messages=HI)]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert "content_block_delta" in kinds and "message_delta" in kinds, kinds


def non_streaming():
    m = client.messages.create(model="chat-anthropic", max_tokens=256, messages=HI)
    assert m.content[0].text == TEXT, m
    assert m.model == "sim-quick-anthropic", m.model
    assert m.stop_reason == "end_turn", m.stop_reason


def tool_use(model):
    def run():
        tools = [{"name": "get_weather", "input_schema": {
            "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}}]
        with client.messages.stream(model=model, max_tokens=256, tools=tools,
                                    messages=[{"role": "user", "content": "weather?"}]) as stream:
            final = stream.get_final_message()
        calls = [b for b in final.content if b.type == "tool_use"]
        assert final.stop_reason == "tool_use", final.stop_reason
        assert len(calls) == 1, final.content
        assert calls[0].name == "get_weather", calls
        assert calls[0].input == {"city": "Paris", "unit": "celsius"}, calls
    return run


def unknown_model_is_not_found():
    try:
        client.messages.create(model="nope", max_tokens=16, messages=HI)
    except anthropic.NotFoundError as e:
        assert "chat" in str(e), e
        return
    raise AssertionError("expected NotFoundError")


def rate_limited_is_rate_limit_error():
    try:
        client.messages.create(model="limited", max_tokens=16, stream=True, messages=HI)
    except anthropic.RateLimitError as e:
        assert e.response.headers.get("retry-after"), e.response.headers
        assert e.body["error"]["type"] == "rate_limit_error", e.body
        return
    raise AssertionError("expected RateLimitError")


def truncation_is_an_exception():
    got = ""
    try:
        with client.messages.stream(model="broken", max_tokens=256, messages=HI) as stream:
            for text in stream.text_stream:
                got += text
    except anthropic.APIStatusError as e:
        assert got, "some text arrived before the failure"
        assert e.body and e.body.get("type") == "error", e.body
        return
    raise AssertionError(f"a truncated stream ended like a complete one: {got!r}")


def wrong_key_is_authentication_error():
    wrong = anthropic.Anthropic(base_url=BASE, api_key="tc_not-a-key", max_retries=0, timeout=30)
    try:
        wrong.messages.create(model="chat", max_tokens=16, messages=HI)
    except anthropic.AuthenticationError as e:
        assert e.body["error"]["type"] == "authentication_error", e.body
        assert "tc_not-a-key" not in str(e), e
        return
    raise AssertionError("expected AuthenticationError")


def foreign_tenant_is_permission_denied():
    try:
        client.messages.create(model="chat", max_tokens=16, messages=HI,
                               extra_headers={"x-tailcut-tenant": "someone-else"})
    except anthropic.PermissionDeniedError as e:
        assert e.body["error"]["type"] == "permission_error", e.body
        return
    raise AssertionError("expected PermissionDeniedError")


THINKING = {"type": "enabled", "budget_tokens": 1024}
WEATHER = [{"name": "get_weather", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}}]


def thinking_streams_with_its_signature():
    seen = set()
    with client.messages.stream(model="chat-anthropic", max_tokens=2048, thinking=THINKING,
                                messages=HI) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                seen.add(event.delta.type)
        final = stream.get_final_message()
    assert {"thinking_delta", "signature_delta", "text_delta"} <= seen, seen
    assert final.content[0].type == "thinking", final.content
    assert final.content[0].thinking and final.content[0].signature, final.content[0]
    assert final.content[-1].text == TEXT, final.content


def a_tool_loop_sends_the_signed_thinking_back():
    ask = [{"role": "user", "content": "weather?"}]
    first = client.messages.create(model="tools-anthropic", max_tokens=2048, thinking=THINKING,
                                   tools=WEATHER, messages=ask)
    assert first.content[0].type == "thinking", first.content
    call = next(b for b in first.content if b.type == "tool_use")
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 C"}]}
    # The SDK's own objects sent back as they are, as applications do.
    again = client.messages.create(model="tools-anthropic", max_tokens=2048, thinking=THINKING, tools=WEATHER,
                                   messages=ask + [{"role": "assistant", "content": first.content}, result])
    assert again.content, again
    try:
        client.messages.create(model="tools-anthropic", max_tokens=2048, thinking=THINKING, tools=WEATHER,
                               messages=ask + [{"role": "assistant", "content": [call]}, result])
    except anthropic.BadRequestError as e:
        assert "thinking" in str(e), e
        return
    raise AssertionError("a tool turn without its thinking block was accepted")


def prompt_caching_is_reported():
    system = [{"type": "text", "text": "You answer briefly. " * 60, "cache_control": {"type": "ephemeral"}}]
    first = client.messages.create(model="chat-anthropic", max_tokens=64, system=system, messages=HI)
    assert first.usage.cache_creation_input_tokens > 0, first.usage
    second = client.messages.create(model="chat-anthropic", max_tokens=64, system=system, messages=HI)
    assert second.usage.cache_read_input_tokens > 0, second.usage


def a_pdf_document_reaches_an_anthropic_route():
    pdf = "JVBERi0xLjQKJeLjz9MKMSAwIG9iago8PD4+CmVuZG9iagp0cmFpbGVyCjw8Pj4KJSVFT0YK"
    m = client.messages.create(model="chat-anthropic", max_tokens=256, messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": pdf}},
        {"type": "text", "text": "Summarise it."}]}])
    assert m.content[0].text == TEXT, m


def thinking_needs_an_anthropic_route():
    try:
        client.messages.create(model="chat", max_tokens=2048, thinking=THINKING, messages=HI)
    except anthropic.BadRequestError as e:
        assert "thinking" in str(e), e
        return
    raise AssertionError("an OpenAI route answered without the signed thinking asked for")


def tokens_are_counted():
    counted = client.messages.count_tokens(model="chat-anthropic", messages=HI)
    assert counted.input_tokens > 0, counted


check("thinking streams with its signature", thinking_streams_with_its_signature)
check("a tool loop sends the signed thinking back (and is refused without it)",
      a_tool_loop_sends_the_signed_thinking_back)
check("prompt caching is reported", prompt_caching_is_reported)
check("count_tokens answers", tokens_are_counted)
check("a PDF document reaches an Anthropic route", a_pdf_document_reaches_an_anthropic_route)
check("thinking to an OpenAI-only model -> BadRequestError naming it", thinking_needs_an_anthropic_route)
check("openai route streams text to the anthropic SDK", streams_text("chat"))
check("anthropic route streams text", streams_text("chat-anthropic"))
check("raw events carry their types", raw_events_are_typed)
check("non-streaming message", non_streaming)
check("tool use arrives whole (openai route)", tool_use("tools"))
check("tool use arrives whole (anthropic route)", tool_use("tools-anthropic"))
check("restart before anything visible is invisible", tool_use("tools-flaky"))
check("unknown model -> NotFoundError", unknown_model_is_not_found)
check("all routes 429 -> RateLimitError with retry-after", rate_limited_is_rate_limit_error)
check("mid-stream truncate -> APIStatusError, not a normal end", truncation_is_an_exception)
if API_KEY:
    check("wrong key -> AuthenticationError (401)", wrong_key_is_authentication_error)
    check("another tenant -> PermissionDeniedError (403)", foreign_tenant_is_permission_denied)

print(f"anthropic SDK checks: {total - len(failures)} ok, {len(failures)} failing")
sys.exit(1 if failures else 0)
