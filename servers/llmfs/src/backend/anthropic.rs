//! Anthropic's Messages API (`POST {url}/v1/messages`): the request body translated from a
//! chat-completions conversation, its server-sent event stream and its whole reply.

use futures_util::{Stream, StreamExt};
use serde_json::{Value, json};

use super::{
    ANTHROPIC_DEFAULT_MAX_TOKENS, AskError, AskRequest, Event, Reply, SseResult, ToolCall, Usage,
    count, error_message, finish_calls, malformed, parse_data,
};

pub(super) fn anthropic_body(req: &AskRequest) -> Result<Value, AskError> {
    let mut messages: Vec<Value> = Vec::with_capacity(req.messages.len());
    for m in &req.messages {
        let converted = anthropic_message(m)?;
        // The results of one reply's several tool calls go back as one user message of
        // `tool_result` blocks, as Anthropic's API asks.
        let is_results = |v: &Value| {
            v["role"] == "user"
                && v["content"]
                    .as_array()
                    .is_some_and(|b| b.iter().all(|b| b["type"] == "tool_result"))
        };
        match messages.last_mut() {
            Some(last) if is_results(last) && is_results(&converted) => {
                let blocks = converted["content"].as_array().cloned().unwrap_or_default();
                if let Some(into) = last["content"].as_array_mut() {
                    into.extend(blocks);
                }
            }
            _ => messages.push(converted),
        }
    }
    let mut body = json!({
        "model": req.model,
        "messages": messages,
        "max_tokens": req.max_tokens.unwrap_or(ANTHROPIC_DEFAULT_MAX_TOKENS),
        "stream": true,
    });
    if let Some(system) = &req.system {
        body["system"] = json!(system);
    }
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| {
                let f = t.get("function").unwrap_or(t);
                json!({
                    "name": f.get("name").cloned().unwrap_or(Value::Null),
                    "description": f.get("description").cloned().unwrap_or(json!("")),
                    "input_schema": f.get("parameters").cloned()
                        .unwrap_or(json!({"type": "object"})),
                })
            })
            .collect();
    }
    Ok(body)
}

/// One chat-completions message as an Anthropic one: a tool result is a user message with a
/// `tool_result` block, an assistant's tool calls are `tool_use` blocks.
fn anthropic_message(m: &Value) -> Result<Value, AskError> {
    let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
    let content = m.get("content").cloned().unwrap_or(Value::Null);
    match role {
        "tool" => Ok(json!({"role": "user", "content": [{
            "type": "tool_result",
            "tool_use_id": m.get("tool_call_id").cloned().unwrap_or(Value::Null),
            "content": content,
        }]})),
        "assistant" => {
            let mut blocks = Vec::new();
            if let Some(text) = content.as_str().filter(|t| !t.is_empty()) {
                blocks.push(json!({"type": "text", "text": text}));
            }
            for call in m
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let f = &call["function"];
                let args = f["arguments"].as_str().unwrap_or("{}");
                let input: Value = serde_json::from_str(args).map_err(|e| {
                    AskError::BadRequest(format!("a tool call's arguments are not JSON: {e}"))
                })?;
                blocks.push(json!({"type": "tool_use", "id": call["id"],
                                   "name": f["name"], "input": input}));
            }
            Ok(json!({"role": "assistant", "content": blocks}))
        }
        "user" => Ok(json!({"role": "user", "content": content})),
        other => Err(AskError::BadRequest(format!(
            "role {other:?} has no Anthropic equivalent"
        ))),
    }
}

pub(super) fn anthropic_whole(v: &Value) -> Result<Reply, AskError> {
    let blocks = v
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed("a message without `content`"))?;
    let mut reply = Reply {
        finish_reason: v["stop_reason"].as_str().map(str::to_owned),
        usage: Usage {
            prompt_tokens: count(&v["usage"]["input_tokens"]),
            completion_tokens: count(&v["usage"]["output_tokens"]),
        },
        ..Reply::default()
    };
    let mut calls = Vec::new();
    for b in blocks {
        match b["type"].as_str() {
            Some("text") => reply.text.push_str(b["text"].as_str().unwrap_or_default()),
            Some("tool_use") => calls.push(ToolCall {
                id: b["id"].as_str().unwrap_or_default().to_owned(),
                name: b["name"].as_str().unwrap_or_default().to_owned(),
                arguments: b["input"].to_string(),
            }),
            _ => {}
        }
    }
    finish_calls(&mut reply, calls, &mut |_| {})?;
    Ok(reply)
}

pub(super) async fn anthropic_stream<E: std::fmt::Display>(
    events: impl Stream<Item = SseResult<E>>,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<Reply, AskError> {
    let mut events = std::pin::pin!(events);
    let mut reply = Reply::default();
    // The tool_use block being filled, if any.
    let mut open_call: Option<ToolCall> = None;
    let mut calls = Vec::new();
    let mut stopped = false;
    while let Some(ev) = events.next().await {
        let ev = ev.map_err(|e| AskError::BrokenOff(e.to_string()))?;
        if ev.event == "ping" || ev.data.trim().is_empty() {
            continue;
        }
        let data = parse_data(&ev.data)?;
        match data["type"].as_str().unwrap_or(ev.event.as_str()) {
            "message_start" => {
                let u = &data["message"]["usage"];
                reply.usage.prompt_tokens = count(&u["input_tokens"]);
                reply.usage.completion_tokens = count(&u["output_tokens"]);
            }
            "content_block_start" => {
                let b = &data["content_block"];
                if b["type"] == "tool_use" {
                    open_call = Some(ToolCall {
                        id: b["id"].as_str().unwrap_or_default().to_owned(),
                        name: b["name"].as_str().unwrap_or_default().to_owned(),
                        arguments: String::new(),
                    });
                } else if let Some(text) = b["text"].as_str().filter(|t| !t.is_empty()) {
                    reply.text.push_str(text);
                    on_event(Event::Text(text.to_owned()));
                }
            }
            "content_block_delta" => {
                let d = &data["delta"];
                match d["type"].as_str() {
                    Some("text_delta") => {
                        let text = d["text"].as_str().unwrap_or_default();
                        if !text.is_empty() {
                            reply.text.push_str(text);
                            on_event(Event::Text(text.to_owned()));
                        }
                    }
                    Some("input_json_delta") => match &mut open_call {
                        Some(call) => {
                            call.arguments
                                .push_str(d["partial_json"].as_str().unwrap_or_default());
                        }
                        None => return Err(malformed("input_json_delta outside a tool_use block")),
                    },
                    _ => {}
                }
            }
            "content_block_stop" => calls.extend(open_call.take()),
            "message_delta" => {
                if let Some(r) = data["delta"]["stop_reason"].as_str() {
                    reply.finish_reason = Some(r.to_owned());
                }
                if let Some(n) = data["usage"]["output_tokens"].as_u64() {
                    reply.usage.completion_tokens = n;
                }
                if let Some(n) = data["usage"]["input_tokens"].as_u64() {
                    reply.usage.prompt_tokens = n;
                }
            }
            "message_stop" => {
                stopped = true;
                break;
            }
            "error" => {
                return Err(AskError::Reported(error_message(ev.data.as_bytes())));
            }
            _ => {}
        }
    }
    if !stopped {
        return Err(AskError::BrokenOff(
            "the stream ended before message_stop".into(),
        ));
    }
    finish_calls(&mut reply, calls, on_event)?;
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use eventsource_stream::Eventsource;

    use super::*;

    fn sse(text: &'static str) -> impl Stream<Item = SseResult<std::convert::Infallible>> {
        futures_util::stream::iter([Ok::<_, std::convert::Infallible>(text.as_bytes())])
            .eventsource()
    }

    /// An Anthropic stream as its documentation shows one: text, then a tool_use whose input
    /// arrives in pieces, then the stop and the output count.
    #[tokio::test]
    async fn an_anthropic_stream_gives_text_a_whole_tool_call_and_usage() {
        let stream = sse(concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: ping\ndata: {\"type\": \"ping\"}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Let me \"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"check.\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\": \"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\\\"Paris\\\"}\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":40}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        ));
        let mut seen = Vec::new();
        let reply = anthropic_stream(stream, &mut |e| seen.push(e))
            .await
            .unwrap();
        let call = ToolCall {
            id: "toolu_1".into(),
            name: "get_weather".into(),
            arguments: "{\"city\": \"Paris\"}".into(),
        };
        assert_eq!(
            seen,
            vec![
                Event::Text("Let me ".into()),
                Event::Text("check.".into()),
                Event::ToolCall(call.clone())
            ]
        );
        assert_eq!(reply.text, "Let me check.");
        assert_eq!(reply.tool_calls, vec![call]);
        assert_eq!(reply.finish_reason.as_deref(), Some("tool_use"));
        assert_eq!(
            reply.usage,
            Usage {
                prompt_tokens: 25,
                completion_tokens: 40
            }
        );
    }

    #[tokio::test]
    async fn an_anthropic_stream_without_message_stop_is_broken_off() {
        let stream = sse(concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
        ));
        let e = anthropic_stream(stream, &mut |_| {}).await.unwrap_err();
        assert!(matches!(e, AskError::BrokenOff(_)), "{e}");
    }

    /// The conversation in chat-completions shape becomes Anthropic's: the system prompt at the
    /// top, tool calls as tool_use blocks, a tool result as a user tool_result block.
    #[test]
    fn a_conversation_is_translated_to_anthropic_messages() {
        let req = AskRequest {
            model: "claude".into(),
            system: Some("be brief".into()),
            tools: vec![json!({"type": "function", "function": {
                "name": "get_weather", "description": "weather",
                "parameters": {"type": "object"}}})],
            messages: vec![
                json!({"role": "user", "content": "weather in Paris?"}),
                json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c1",
                       "type": "function", "function": {"name": "get_weather",
                       "arguments": "{\"city\":\"Paris\"}"}}]}),
                json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}),
            ],
            max_tokens: None,
        };
        let body = anthropic_body(&req).unwrap();
        assert_eq!(body["system"], "be brief");
        assert_eq!(body["max_tokens"], ANTHROPIC_DEFAULT_MAX_TOKENS);
        assert_eq!(body["tools"][0]["input_schema"], json!({"type": "object"}));
        assert_eq!(
            body["messages"][1]["content"][0],
            json!({"type": "tool_use", "id": "c1", "name": "get_weather",
                   "input": {"city": "Paris"}})
        );
        assert_eq!(body["messages"][2]["role"], "user");
        assert_eq!(body["messages"][2]["content"][0]["tool_use_id"], "c1");
    }

    /// Several tool results in a row (one reply's calls, answered in one ask) are one user
    /// message of `tool_result` blocks.
    #[test]
    fn consecutive_tool_results_are_one_anthropic_message() {
        let req = AskRequest {
            model: "claude".into(),
            system: None,
            tools: vec![],
            messages: vec![
                json!({"role": "user", "content": "two things"}),
                json!({"role": "assistant", "content": "", "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}),
                json!({"role": "tool", "tool_call_id": "a", "content": "1"}),
                json!({"role": "tool", "tool_call_id": "b", "content": "2"}),
                json!({"role": "user", "content": "thanks"}),
            ],
            max_tokens: None,
        };
        let body = anthropic_body(&req).unwrap();
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 4, "{body}");
        let ids: Vec<&Value> = messages[2]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| &b["tool_use_id"])
            .collect();
        assert_eq!(ids, [&json!("a"), &json!("b")]);
        assert_eq!(messages[3], json!({"role": "user", "content": "thanks"}));
    }
}
