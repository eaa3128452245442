//! The API reference: `/api/openapi.json` (the OpenAPI document) and `/api/docs`, a self-contained HTML page
//! rendered from that document on the server, with its styles inline: no script, no CDN, works offline.

use std::fmt::Write;
use std::sync::OnceLock;

use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use serde_json::Value;

fn spec() -> &'static Value {
    static SPEC: OnceLock<Value> = OnceLock::new();
    SPEC.get_or_init(|| serde_json::to_value(super::openapi()).unwrap_or(Value::Null))
}

/// `GET /api/openapi.json`.
pub async fn openapi_json() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], spec().to_string()).into_response()
}

/// `GET /api/docs`.
pub async fn reference() -> Html<&'static str> {
    static PAGE: OnceLock<String> = OnceLock::new();
    Html(PAGE.get_or_init(|| render(spec())).as_str())
}

fn esc(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The schema name a `$ref` points to, or a short type description.
fn type_of(schema: &Value) -> String {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.rsplit('/').next().unwrap_or(r);
        return format!("<a href=\"#schema-{0}\">{0}</a>", esc(name));
    }
    if let Some(items) = schema.get("items") {
        return format!("array of {}", type_of(items));
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(list) = schema.get(key).and_then(Value::as_array) {
            return list.iter().map(type_of).collect::<Vec<_>>().join(" | ");
        }
    }
    match schema.get("type") {
        Some(Value::String(t)) => esc(t),
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).map(esc).collect::<Vec<_>>().join(" | "),
        _ => "object".to_string(),
    }
}

const STYLE: &str = "body{font:15px/1.5 system-ui,sans-serif;max-width:980px;margin:2rem auto;padding:0 1rem;\
color:#1b1f24;background:#fff}@media(prefers-color-scheme:dark){body{color:#e6e8eb;background:#14171a}\
table,td,th{border-color:#333!important}code,.op{background:#22272e!important}}h1{margin-bottom:0}\
h2{border-bottom:1px solid #ccc;padding-top:1rem}.op{background:#f4f6f8;border-radius:6px;padding:.6rem 1rem;\
margin:1rem 0}.m{display:inline-block;min-width:4.5rem;font-weight:700;font-family:monospace}.get{color:#0a7}\
.post{color:#06c}.put{color:#a60}.delete,.patch{color:#c33}table{border-collapse:collapse;width:100%;margin:.4rem 0}\
td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:left;vertical-align:top}code{background:#eef;\
padding:0 .2rem;border-radius:3px}";

fn render(spec: &Value) -> String {
    let mut out = String::new();
    let title = spec["info"]["title"].as_str().unwrap_or("API");
    let version = spec["info"]["version"].as_str().unwrap_or("");
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" \
         content=\"width=device-width,initial-scale=1\"><title>{t} API reference</title><style>{STYLE}</style></head><body>\
         <h1>{t} API</h1><p>Version {v}. {d} Authenticate with <code>Authorization: Bearer tsr_...</code>. Errors are \
         <code>application/problem+json</code> with a stable <code>code</code>. Machine-readable: \
         <a href=\"/api/openapi.json\">openapi.json</a>.</p>",
        t = esc(title),
        v = esc(version),
        d = esc(spec["info"]["description"].as_str().unwrap_or("")),
    );
    let tags: Vec<&str> =
        spec["tags"].as_array().map(|ts| ts.iter().filter_map(|t| t["name"].as_str()).collect()).unwrap_or_default();
    let paths = spec["paths"].as_object().cloned().unwrap_or_default();
    for tag in tags {
        let _ = write!(out, "<h2 id=\"tag-{0}\">{0}</h2>", esc(tag));
        for (path, item) in &paths {
            for method in ["get", "post", "put", "patch", "delete"] {
                let Some(op) = item.get(method) else { continue };
                if !op["tags"].as_array().is_some_and(|t| t.iter().any(|x| x == tag)) {
                    continue;
                }
                render_operation(&mut out, method, path, op);
            }
        }
    }
    out.push_str("<h2 id=\"schemas\">Schemas</h2>");
    if let Some(schemas) = spec["components"]["schemas"].as_object() {
        for (name, schema) in schemas {
            let _ = write!(out, "<div class=\"op\" id=\"schema-{0}\"><b>{0}</b>", esc(name));
            if let Some(d) = schema["description"].as_str() {
                let _ = write!(out, "<p>{}</p>", esc(d));
            }
            if let Some(props) = schema["properties"].as_object() {
                let required: Vec<&str> = schema["required"]
                    .as_array()
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                out.push_str("<table><tr><th>field</th><th>type</th><th>description</th></tr>");
                for (field, p) in props {
                    let req = if required.contains(&field.as_str()) { " (required)" } else { "" };
                    let _ = write!(
                        out,
                        "<tr><td><code>{}</code>{req}</td><td>{}</td><td>{}</td></tr>",
                        esc(field),
                        type_of(p),
                        esc(p["description"].as_str().unwrap_or(""))
                    );
                }
                out.push_str("</table>");
            } else if let Some(variants) = schema["oneOf"].as_array() {
                let _ = write!(
                    out,
                    "<p>One of: {}</p>",
                    variants
                        .iter()
                        .map(|v| {
                            let mode = v["properties"]["mode"]["enum"][0].as_str().map(esc);
                            mode.unwrap_or_else(|| type_of(v))
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            } else if let Some(values) = schema["enum"].as_array() {
                let _ = write!(
                    out,
                    "<p>One of: {}</p>",
                    values
                        .iter()
                        .filter_map(Value::as_str)
                        .map(|v| format!("<code>{}</code>", esc(v)))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            out.push_str("</div>");
        }
    }
    out.push_str("</body></html>");
    out
}

fn render_operation(out: &mut String, method: &str, path: &str, op: &Value) {
    let _ = write!(
        out,
        "<div class=\"op\"><span class=\"m {method}\">{}</span> <code>{}</code><p>{}</p>",
        method.to_uppercase(),
        esc(path),
        esc(op["description"].as_str().or(op["summary"].as_str()).unwrap_or(""))
    );
    if let Some(params) = op["parameters"].as_array().filter(|p| !p.is_empty()) {
        out.push_str("<table><tr><th>parameter</th><th>in</th><th>type</th><th>description</th></tr>");
        for p in params {
            let req = if p["required"].as_bool() == Some(true) { " (required)" } else { "" };
            let _ = write!(
                out,
                "<tr><td><code>{}</code>{req}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(p["name"].as_str().unwrap_or("")),
                esc(p["in"].as_str().unwrap_or("")),
                type_of(&p["schema"]),
                esc(p["description"].as_str().unwrap_or(""))
            );
        }
        out.push_str("</table>");
    }
    if let Some(body) = op["requestBody"]["content"].as_object().and_then(|c| c.values().next()) {
        let _ = write!(out, "<p>Body: {}</p>", type_of(&body["schema"]));
    }
    if let Some(responses) = op["responses"].as_object() {
        out.push_str("<table><tr><th>status</th><th>body</th><th>description</th></tr>");
        for (status, r) in responses {
            let schema = r["content"]
                .as_object()
                .and_then(|c| c.values().next())
                .map(|c| type_of(&c["schema"]))
                .unwrap_or_default();
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{schema}</td><td>{}</td></tr>",
                esc(status),
                esc(r["description"].as_str().unwrap_or(""))
            );
        }
        out.push_str("</table>");
    }
    out.push_str("</div>");
}
