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


def test_a_server_fault_is_logged_under_an_id_and_its_text_stays_out_of_the_answer(capsys):
    """A 500 names an incident id the log holds with the traceback; the fault's message (a path, a prompt) and type
    stay in the log: the answer carries neither."""
    from edge.serve.app import server_error
    try:
        open("/nonexistent/secret-prompt.txt")
    except OSError as fault:
        e = server_error(fault)
    body, log = e.body()["error"], capsys.readouterr().err
    incident = body["message"].split()[2].rstrip(":")
    assert (e.status, body["code"], body["type"]) == (500, "internal_error", "server_error"), body
    assert "secret-prompt" not in str(e.body()) and "FileNotFoundError" not in str(e.body()), body
    assert f"internal error {incident}:" in log and "secret-prompt" in log and "Traceback" in log, log
