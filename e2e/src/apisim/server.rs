//! The HTTP front: hyper 1 (HTTP/1.1, plain TCP), request routing onto `Api`,
//! query parsing, JSON responses and chunked watch streams. Every failure is a
//! `metav1.Status` response; nothing here panics on client input.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{ACCEPT, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::api::{Api, DeleteOptions, ListOptions, Sub, Target};
use super::discovery;
use super::error::ApiError;
use super::faults::Faults;
use super::patch::{self, PatchKind};
use super::resources::ResourceInfo;
use super::select::{FieldSelector, LabelSelector};
use super::table;
use super::watch::{self as watchmod, Repr, WatchRequest};

pub type Body = BoxBody<Bytes, Infallible>;

const MAX_BODY: usize = 32 << 20;

/// What request handlers share.
pub struct State {
    pub api: Arc<Api>,
    pub faults: Arc<Faults>,
    pub bookmark_every: Duration,
}

/// Accepts connections until `shutdown` flips, then aborts all of them (watches
/// included).
pub async fn serve(listener: TcpListener, state: Arc<State>, mut shutdown: watch::Receiver<bool>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => {
                let (stream, _) = match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let st = state.clone();
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let st = st.clone();
                        async move { Ok::<_, Infallible>(handle(st, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    conns.abort_all();
}

fn full(code: StatusCode, ct: &str, body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = code;
    if let Ok(v) = ct.parse() {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

fn json_response(code: StatusCode, v: &Value) -> Response<Body> {
    full(
        code,
        "application/json",
        serde_json::to_vec(v).unwrap_or_default(),
    )
}

fn error_response(e: &ApiError) -> Response<Body> {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(code, &e.to_status())
}

async fn handle(st: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let delay = st.faults.delay();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let resp = match route(&st, req).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    };
    tracing::debug!(%method, %path, status = resp.status().as_u16(), "request");
    resp
}

/// A request's parsed resource path.
struct ResPath {
    info: Arc<ResourceInfo>,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
    watch_prefix: bool,
}

fn parse_query(q: Option<&str>) -> HashMap<String, String> {
    form_urlencoded::parse(q.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

async fn route(st: &Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let reg = &st.api.registry;
    let ok = |v: Value| Ok(json_response(StatusCode::OK, &v));
    let get_only = |m: &Method| -> Result<(), ApiError> {
        if m == Method::GET {
            Ok(())
        } else {
            Err(ApiError::method_not_allowed(&path))
        }
    };
    match segs.as_slice() {
        [] => {
            get_only(req.method())?;
            return ok(
                json!({"paths": ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/openapi/v3", "/readyz", "/version"]}),
            );
        }
        ["version"] => return ok(discovery::version()),
        ["healthz" | "readyz" | "livez"] => {
            return Ok(full(StatusCode::OK, "text/plain", b"ok".to_vec()));
        }
        ["api"] => return ok(discovery::core_versions()),
        ["apis"] => return ok(discovery::group_list(reg)),
        ["apis", g] => {
            return discovery::group(reg, g)
                .map_or_else(|| Err(ApiError::path_not_found(&path)), ok);
        }
        ["openapi", "v3"] => return ok(discovery::openapi_index(reg)),
        ["openapi", "v3", rest @ ..] => {
            return discovery::openapi_gv(reg, &rest.join("/"))
                .map_or_else(|| Err(ApiError::path_not_found(&path)), ok);
        }
        _ => {}
    }
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", v, rest),
        ["apis", g, v, rest @ ..] => (g, v, rest),
        _ => return Err(ApiError::path_not_found(&path)),
    };
    if rest.is_empty() {
        return discovery::resource_list(reg, group, version)
            .map_or_else(|| Err(ApiError::path_not_found(&path)), ok);
    }
    let rp =
        parse_res_path(st, group, version, rest).ok_or_else(|| ApiError::path_not_found(&path))?;
    let query = parse_query(req.uri().query());
    let dry_run = match query.get("dryRun").map(String::as_str) {
        None | Some("") => false,
        Some("All") => req.method() != Method::GET,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "dryRun: Unsupported value: {other:?}: supported values: \"All\""
            )));
        }
    };
    let is_write = matches!(
        *req.method(),
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    if is_write && st.faults.take_write_failure() {
        return Err(ApiError::internal(
            "injected failure (apisim fault: fail_next_writes)",
        ));
    }
    let accept = header(&req, ACCEPT);
    let ctype = header(&req, CONTENT_TYPE);
    let method = req.method().clone();
    let body = if matches!(
        method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    ) {
        read_body(req).await?
    } else {
        Bytes::new()
    };
    // A dry run is the same request against a throw-away copy of the state
    // (objects, registry, allocators): every check and default runs, nothing stays.
    let forked;
    let api: &Api = if dry_run {
        forked = st.api.fork();
        &forked
    } else {
        &st.api
    };
    let info = rp.info.clone();
    let ns_for_write = rp.namespace.clone().unwrap_or_default();
    if info.namespaced && rp.name.is_some() && rp.namespace.is_none() {
        return Err(ApiError::path_not_found(&path));
    }
    match (rp.name.as_deref(), rp.sub.as_deref()) {
        (None, _) => match method {
            Method::GET => {
                let watching = rp.watch_prefix
                    || matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
                if watching {
                    return start_watch(st, &info, rp.namespace, &query, Repr::of(&accept));
                }
                list(st, &info, rp.namespace.as_deref(), &query, &accept)
            }
            Method::POST => {
                let obj = parse_body(&body, &ctype)?;
                let created = api.create(&info, &ns_for_write, obj)?;
                Ok(json_response(StatusCode::CREATED, &created))
            }
            Method::DELETE => {
                let opts = list_options(&query)?;
                let page = api.list(
                    &info,
                    rp.namespace.as_deref(),
                    &ListOptions {
                        limit: None,
                        continue_token: None,
                        ..opts
                    },
                )?;
                let mut items = Vec::new();
                for obj in page.items {
                    let t = Target {
                        info: info.clone(),
                        namespace: meta_ns(&obj),
                        name: super::meta::name(&obj).to_string(),
                    };
                    match api.delete(&t, &DeleteOptions::default()) {
                        Ok(o) => items.push((*o).clone()),
                        Err(e) if e.code == 404 => {}
                        Err(e) => return Err(e),
                    }
                }
                ok(
                    json!({"kind": format!("{}List", info.kind), "apiVersion": info.api_version(), "metadata": {}, "items": items}),
                )
            }
            _ => Err(ApiError::method_not_allowed(&path)),
        },
        (Some(name), sub) => {
            let t = Target {
                info: info.clone(),
                namespace: if info.namespaced {
                    ns_for_write
                } else {
                    String::new()
                },
                name: name.to_string(),
            };
            let which = match sub {
                None => Sub::Main,
                Some("status") if info.status => Sub::Status,
                Some("scale") if info.scale => return scale(api, &t, &method, &body, &ctype),
                Some(_) => return Err(ApiError::path_not_found(&path)),
            };
            let obj = match method {
                Method::GET => {
                    let o = api.get(&t)?;
                    if table::wants_table(&accept) {
                        return ok(table::render(&info, &[o], api.store.current_rv()));
                    }
                    if table::wants_metadata(&accept) {
                        return ok(table::partial(&o));
                    }
                    o
                }
                Method::PUT => api.update(&t, which, parse_body(&body, &ctype)?)?,
                Method::PATCH => {
                    let kind = PatchKind::from_content_type(&ctype)
                        .map_err(|_| ApiError::unsupported_media(&ctype))?;
                    let p = parse_body(&body, &ctype)?;
                    if kind == PatchKind::Apply
                        && query.get("fieldManager").is_none_or(|m| m.is_empty())
                    {
                        return Err(ApiError::bad_request(
                            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                        ));
                    }
                    api.patch(
                        &t,
                        which,
                        kind,
                        &p,
                        query.get("fieldManager").map(String::as_str),
                        query.get("force").is_some_and(|f| f == "true"),
                    )?
                }
                Method::DELETE => {
                    if which == Sub::Status {
                        return Err(ApiError::method_not_allowed(&path));
                    }
                    api.delete(&t, &delete_options(&body, &query)?)?
                }
                _ => return Err(ApiError::method_not_allowed(&path)),
            };
            ok((*obj).clone())
        }
    }
}

fn meta_ns(obj: &Value) -> String {
    super::meta::namespace(obj).to_string()
}

fn header(req: &Request<Incoming>, h: hyper::header::HeaderName) -> String {
    req.headers()
        .get(h)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

fn parse_res_path(st: &State, group: &str, version: &str, rest: &[&str]) -> Option<ResPath> {
    let (watch_prefix, rest) = match rest {
        ["watch", r @ ..] => (true, r),
        r => (false, r),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, r @ ..]
            if !(r.is_empty() || r.len() == 1 && matches!(r[0], "status" | "finalize")) =>
        {
            (Some(ns.to_string()), r)
        }
        r => (None, r),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(s.to_string())),
        _ => return None,
    };
    let info = st.api.registry.lookup(group, version, plural)?;
    if namespace.is_some() && !info.namespaced {
        return None;
    }
    Some(ResPath {
        info,
        namespace,
        name,
        sub,
        watch_prefix,
    })
}

async fn read_body(req: Request<Incoming>) -> Result<Bytes, ApiError> {
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(ApiError::too_large())
        }
        Err(e) => Err(ApiError::bad_request(format!(
            "reading the request body: {e}"
        ))),
    }
}

/// JSON bodies, and YAML for apply patches (`application/apply-patch+yaml`).
fn parse_body(body: &[u8], ctype: &str) -> Result<Value, ApiError> {
    if ctype.contains("protobuf") {
        return super::protobuf::decode(body)
            .map_err(|e| ApiError::unsupported_media_msg(e.to_string()));
    }
    if ctype.contains("cbor") {
        return Err(ApiError::unsupported_media(ctype));
    }
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    match serde_json::from_slice(body) {
        Ok(v) => Ok(v),
        Err(je) if ctype.contains("yaml") => serde_yaml::from_slice(body).map_err(|ye| {
            ApiError::bad_request(format!("the body is neither JSON ({je}) nor YAML ({ye})"))
        }),
        Err(e) => Err(ApiError::bad_request(format!(
            "the body of the request could not be decoded as JSON: {e}"
        ))),
    }
}

fn list_options(q: &HashMap<String, String>) -> Result<ListOptions, ApiError> {
    let labels = LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let fields = FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let limit = match q.get("limit").filter(|s| !s.is_empty()) {
        Some(l) => Some(
            l.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
        ),
        None => None,
    };
    Ok(ListOptions {
        labels,
        fields,
        limit,
        continue_token: q.get("continue").cloned(),
    })
}

fn parse_rv(q: &HashMap<String, String>) -> Result<Option<u64>, ApiError> {
    match q.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => Ok(None),
        Some(s) => s
            .parse::<u64>()
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {s:?}"))),
    }
}

fn list(
    st: &State,
    info: &Arc<ResourceInfo>,
    ns: Option<&str>,
    q: &HashMap<String, String>,
    accept: &str,
) -> Result<Response<Body>, ApiError> {
    let opts = list_options(q)?;
    if let Some(rv) = parse_rv(q)? {
        // Exact reads of an old version are answered 410 when that version is
        // gone; other (NotOlderThan) reads are served from the latest state.
        let exact = q.get("resourceVersionMatch").map(String::as_str) == Some("Exact");
        if st.faults.take_expire()
            || (exact && rv != st.api.store.current_rv() && st.api.store.changes_since(rv).is_err())
        {
            return Err(ApiError::gone(format!("too old resource version: {rv}")));
        }
    }
    let page = st.api.list(info, ns, &opts)?;
    if table::wants_table(accept) {
        return Ok(json_response(
            StatusCode::OK,
            &table::render(info, &page.items, page.resource_version),
        ));
    }
    let mut meta = json!({"resourceVersion": page.resource_version.to_string()});
    if let Some(c) = page.continue_token {
        meta["continue"] = json!(c);
    }
    if let Some(r) = page.remaining {
        meta["remainingItemCount"] = json!(r);
    }
    if table::wants_metadata(accept) {
        let items: Vec<Value> = page.items.iter().map(|o| table::partial(o)).collect();
        let body = json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
            "metadata": meta, "items": items});
        return Ok(json_response(StatusCode::OK, &body));
    }
    // Serialized straight from the stored objects (no deep copy of 10k items).
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct ListBody<'a> {
        kind: String,
        api_version: String,
        metadata: Value,
        items: Vec<&'a Value>,
    }
    let body = ListBody {
        kind: format!("{}List", info.kind),
        api_version: info.api_version(),
        metadata: meta,
        items: page.items.iter().map(|a| a.as_ref()).collect(),
    };
    Ok(full(
        StatusCode::OK,
        "application/json",
        serde_json::to_vec(&body).unwrap_or_default(),
    ))
}

fn start_watch(
    st: &Arc<State>,
    info: &Arc<ResourceInfo>,
    ns: Option<String>,
    q: &HashMap<String, String>,
    repr: Repr,
) -> Result<Response<Body>, ApiError> {
    let opts = list_options(q)?;
    let timeout = match q.get("timeoutSeconds").filter(|s| !s.is_empty()) {
        Some(t) => Some(Duration::from_secs(t.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!("invalid timeoutSeconds {t:?}"))
        })?)),
        None => None,
    };
    let truthy = |k: &str| matches!(q.get(k).map(String::as_str), Some("true" | "1"));
    let req = WatchRequest {
        info: info.clone(),
        namespace: ns,
        labels: opts.labels,
        fields: opts.fields,
        resource_version: parse_rv(q)?,
        send_initial_events: truthy("sendInitialEvents"),
        bookmarks: truthy("allowWatchBookmarks"),
        timeout,
        repr,
    };
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(watchmod::run(
        st.api.clone(),
        st.faults.clone(),
        req,
        st.bookmark_every,
        tx,
    ));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut r = Response::new(StreamBody::new(stream).boxed());
    r.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(r)
}

fn delete_options(body: &[u8], q: &HashMap<String, String>) -> Result<DeleteOptions, ApiError> {
    let mut o = DeleteOptions::default();
    if !body.is_empty() {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("DeleteOptions: {e}")))?;
        o.uid = v
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string);
        o.resource_version = v
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
        o.grace_period_seconds = v.get("gracePeriodSeconds").and_then(Value::as_u64);
    }
    if let Some(g) = q.get("gracePeriodSeconds") {
        o.grace_period_seconds = Some(
            g.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds {g:?}")))?,
        );
    }
    if let Some(u) = q.get("preconditions.uid") {
        o.uid = Some(u.clone());
    }
    if let Some(r) = q.get("preconditions.resourceVersion") {
        o.resource_version = Some(r.clone());
    }
    Ok(o)
}

/// `/scale` of Deployments and ReplicaSets as an `autoscaling/v1` Scale.
fn scale(
    api: &Api,
    t: &Target,
    method: &Method,
    body: &[u8],
    ctype: &str,
) -> Result<Response<Body>, ApiError> {
    let to_scale = |o: &Value| {
        let sel = o
            .pointer("/spec/selector/matchLabels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        json!({
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": t.name, "namespace": t.namespace, "uid": o.pointer("/metadata/uid"),
                "resourceVersion": o.pointer("/metadata/resourceVersion"), "creationTimestamp": o.pointer("/metadata/creationTimestamp")},
            "spec": {"replicas": o.pointer("/spec/replicas").cloned().unwrap_or(json!(1))},
            "status": {"replicas": o.pointer("/status/replicas").cloned().unwrap_or(json!(0)), "selector": sel},
        })
    };
    let cur = api.get(t)?;
    let wanted = match *method {
        Method::GET => return Ok(json_response(StatusCode::OK, &to_scale(&cur))),
        Method::PUT => parse_body(body, ctype)?,
        Method::PATCH => {
            let kind = PatchKind::from_content_type(ctype)
                .map_err(|_| ApiError::unsupported_media(ctype))?;
            patch::apply(kind, &to_scale(&cur), &parse_body(body, ctype)?)
                .map_err(|e| ApiError::bad_request(e.to_string()))?
        }
        _ => return Err(ApiError::method_not_allowed("scale")),
    };
    let Some(n) = wanted
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .filter(|n| *n >= 0)
    else {
        return Err(ApiError::invalid(
            "Scale",
            &t.name,
            "spec.replicas: Invalid value: must be a non-negative integer",
        ));
    };
    let mut p = json!({"spec": {"replicas": n}});
    if let Some(rv) = wanted
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        p["metadata"] = json!({"resourceVersion": rv});
    }
    let out = api.patch(t, Sub::Main, PatchKind::Merge, &p, None, false)?;
    Ok(json_response(StatusCode::OK, &to_scale(&out)))
}
