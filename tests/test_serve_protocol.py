"""The server's request checks without a server: fields it cannot honour are refused with the field named, the
values that ask for nothing pass, and a message's text parts keep their boundaries."""

import pytest

from edge.serve.protocol import APIError, chat_request, completion_request

HI = [{"role": "user", "content": "Hi."}]


@pytest.mark.parametrize("field, value", [("add_generation_prompt", False), ("chat_template_kwargs", {"x": 1}),
                                          ("tool_choice", "required"),
                                          ("tool_choice", {"type": "function", "function": {"name": "f"}}),
                                          ("parallel_tool_calls", "yes"), ("service_tier", "priority")])
def test_a_field_this_server_cannot_honour_is_refused_not_dropped(field, value):
    with pytest.raises(APIError) as e:
        chat_request({"messages": HI, field: value})
    assert (e.value.status, e.value.param, e.value.code) == (400, field, "unsupported"), e.value.body()


@pytest.mark.parametrize("field, value", [("add_generation_prompt", True), ("chat_template_kwargs", {}),
                                          ("tool_choice", "none"), ("tool_choice", "auto"),
                                          ("parallel_tool_calls", False), ("service_tier", "auto"),
                                          ("tool_choice", None)])
def test_the_values_that_ask_for_nothing_pass(field, value):
    assert chat_request({"messages": HI, field: value}).messages == HI
    assert completion_request({"prompt": "Hi", field: value}).prompt == "Hi"


def test_text_parts_are_joined_a_line_each():
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]
    r = chat_request({"messages": [{"role": "user", "content": parts}]})
    assert r.messages[0]["content"] == "Hello\nworld", r.messages
