//! The HTTP/JSON server of the API (see [`crate::api`]), on tokio and axum. It takes its
//! listener and a shutdown future, and resyncs the switches periodically in the background.
//! Every request runs on a blocking thread; one that changes a switch waits for that switch
//! only (see [`crate::service`]), so a slow switch holds up neither the other requests nor
//! the heartbeats.

use crate::api::{ErrorBody, Heartbeat, JobRequest, JoinRequest, SwitchSpec, PREFIX};
use crate::service::{Controller, ControllerError};
use crate::state::StateError;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// Why the server did not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Token(#[from] crate::token::TokenError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Required of every request, as `Authorization: Bearer TOKEN`, on every listener
    /// (loopback too: any user of the host can reach it). See [`crate::token`].
    pub token: String,
    /// How often every switch is brought to the state (a restarted switch is provisioned
    /// again within this time).
    pub resync_every: Duration,
    /// Where to serve the controller's counters in Prometheus' text format, if anywhere.
    pub metrics: Option<std::net::SocketAddr>,
    /// Connections served at once; one more is closed at once.
    pub max_connections: usize,
    /// The longest a client may take to send a request's head (also the longest a kept-alive
    /// connection may wait for its next request).
    pub header_timeout: Duration,
    /// The longest a request may take, its body and the switch I/O it causes included.
    pub request_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            token: String::new(),
            resync_every: Duration::from_secs(2),
            metrics: None,
            max_connections: MAX_CONNECTIONS,
            header_timeout: HEADER_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
        }
    }
}

#[derive(Clone)]
struct App {
    ctl: Arc<Controller>,
    token: Arc<str>,
}

/// An error answer.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(ErrorBody { error: self.1 })).into_response()
    }
}

impl From<ControllerError> for ApiError {
    fn from(e: ControllerError) -> ApiError {
        let status = match &e {
            ControllerError::State(s) => match s {
                StateError::BadRequest(_) | StateError::Unplaceable { .. } => {
                    StatusCode::BAD_REQUEST
                }
                StateError::SwitchExists(_) | StateError::JobExists(_) => StatusCode::CONFLICT,
                StateError::NoSuchSwitch(_) | StateError::NoSuchJob(_) => StatusCode::NOT_FOUND,
                StateError::NoJobId => StatusCode::SERVICE_UNAVAILABLE,
            },
            ControllerError::Driver { .. } => StatusCode::BAD_GATEWAY,
            ControllerError::Store(_) | ControllerError::PolicyChanged { .. } => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        ApiError(status, e.to_string())
    }
}

/// Runs `f` on the controller on a blocking thread (drivers do blocking I/O).
async fn run<T: Send + 'static>(
    app: &App,
    f: impl FnOnce(&Controller) -> Result<T, ControllerError> + Send + 'static,
) -> Result<T, ApiError> {
    let ctl = app.ctl.clone();
    tokio::task::spawn_blocking(move || {
        f(&ctl).map_err(|e| {
            if matches!(e, ControllerError::State(_)) {
                ctl.refused();
            }
            ApiError::from(e)
        })
    })
    .await
    .unwrap_or_else(|e| Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())))
}

fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("bad request body: {e}")))
}

/// Serves the API on `listener` until `shutdown` completes; every request must carry
/// [`ServerConfig::token`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    controller: Controller,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let addr = listener.local_addr()?;
    crate::token::check(&config.token)?;
    let app = App {
        ctl: Arc::new(controller),
        token: Arc::from(config.token),
    };
    let stop_metrics = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let _metrics = match config.metrics {
        Some(at) => {
            let ctl = app.ctl.clone();
            let m = ina_io::metrics::MetricsServer::spawn(
                at,
                move || ctl.metrics_text(),
                stop_metrics.clone(),
            )
            .map_err(|e| std::io::Error::other(e.to_string()))?;
            tracing::info!(addr = %m.local_addr, "metrics");
            Some(m)
        }
        None => None,
    };
    let resync = tokio::spawn(resync_loop(app.ctl.clone(), config.resync_every));
    let router = router(app, config.request_timeout);
    tracing::info!(%addr, "controller listening");
    let limits = (config.max_connections.max(1), config.header_timeout);
    let result = accept_loop(listener, router, limits, shutdown).await;
    resync.abort();
    result
}

/// [`ServerConfig::max_connections`] by default.
pub const MAX_CONNECTIONS: usize = 64;
/// [`ServerConfig::header_timeout`] by default.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// [`ServerConfig::request_timeout`] by default (bmv2's runtime CLI may take 20 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Accepts connections until `shutdown` completes, at most `max_connections` at once, each
/// with `header_timeout` for every request head.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    router: Router,
    (max_connections, header_timeout): (usize, Duration),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let places = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = &mut shutdown => return Ok(()),
        };
        let Ok(place) = places.clone().try_acquire_owned() else {
            tracing::warn!(%peer, limit = max_connections, "connection refused: too many open");
            drop(stream);
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let served = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
            drop(place);
        });
    }
}

/// Answers 408 to a request not done within `limit`.
async fn deadline(State(limit): State<Duration>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(r) => r,
        Err(_) => ApiError(
            StatusCode::REQUEST_TIMEOUT,
            format!("the request took longer than {limit:?}"),
        )
        .into_response(),
    }
}

fn router(app: App, request_timeout: Duration) -> Router {
    let v1 = Router::new()
        .route("/health", get(health))
        .route("/switches", get(list_switches).post(add_switch))
        .route("/switches/{name}/drain", post(drain_switch))
        .route("/jobs", get(list_jobs).post(create_job))
        .route("/jobs/{name}", get(show_job).delete(delete_job))
        .route("/jobs/{name}/join", post(join_job))
        .route("/jobs/{name}/heartbeat", post(heartbeat));
    Router::new()
        .nest(PREFIX, v1)
        .fallback(|| async {
            ApiError(
                StatusCode::NOT_FOUND,
                format!("no such endpoint: this is API {PREFIX}"),
            )
        })
        .layer(middleware::from_fn_with_state(app.clone(), authorize))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(request_timeout, deadline))
        .with_state(app)
}

/// Refuses a request without the token.
async fn authorize(State(app): State<App>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if !given.is_some_and(|g| ina_switch_api::tokens_match(g.as_bytes(), app.token.as_bytes())) {
        return ApiError(
            StatusCode::UNAUTHORIZED,
            "missing or wrong access token (Authorization: Bearer TOKEN): a controller started without --token keeps it in STATE_DIR/token (clients: --token-file)".into(),
        )
        .into_response();
    }
    next.run(req).await
}

async fn health(State(app): State<App>) -> Result<Response, ApiError> {
    let h = run(&app, |c| Ok(c.health())).await?;
    Ok(Json(h).into_response())
}

async fn list_switches(State(app): State<App>) -> Result<Response, ApiError> {
    let s = run(&app, |c| Ok(c.switches())).await?;
    Ok(Json(s).into_response())
}

async fn add_switch(State(app): State<App>, body: Bytes) -> Result<Response, ApiError> {
    let spec: SwitchSpec = parse(&body)?;
    let info = run(&app, move |c| c.add_switch(spec)).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

async fn drain_switch(
    State(app): State<App>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let info = run(&app, move |c| c.drain_switch(&name)).await?;
    Ok(Json(info).into_response())
}

async fn list_jobs(State(app): State<App>) -> Result<Response, ApiError> {
    let j = run(&app, |c| Ok(c.jobs())).await?;
    Ok(Json(j).into_response())
}

async fn create_job(State(app): State<App>, body: Bytes) -> Result<Response, ApiError> {
    let req: JobRequest = parse(&body)?;
    let info = run(&app, move |c| c.create_job(req)).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

async fn show_job(State(app): State<App>, Path(name): Path<String>) -> Result<Response, ApiError> {
    let info = run(&app, move |c| c.job(&name)).await?;
    Ok(Json(info).into_response())
}

async fn delete_job(
    State(app): State<App>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    run(&app, move |c| c.delete_job(&name)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn join_job(
    State(app): State<App>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: JoinRequest = parse(&body)?;
    let joined = run(&app, move |c| c.join(&name, req)).await?;
    Ok(Json(joined).into_response())
}

async fn heartbeat(
    State(app): State<App>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let hb: Heartbeat = parse(&body)?;
    let beat = run(&app, move |c| c.heartbeat(&name, &hb)).await?;
    if let Some(switch) = beat.bring {
        // The move its workers parked for, made apart: the heartbeat is answered at once.
        let ctl = app.ctl.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = ctl.bring(&switch) {
                tracing::warn!(%switch, error = %e, "moving the parked job");
            }
        });
    }
    Ok(Json(beat.job).into_response())
}

/// Every period: checks the workers' heartbeats, then resyncs each switch on a thread of its
/// own, so that a slow switch delays neither the liveness checks nor the other switches (a
/// switch still busy from before is skipped).
async fn resync_loop(ctl: Arc<Controller>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let c = ctl.clone();
        let _ = tokio::task::spawn_blocking(move || c.check_members()).await;
        let now = std::time::Instant::now();
        for switch in ctl.switch_names() {
            let c = ctl.clone();
            tokio::task::spawn_blocking(move || c.resync_switch(&switch, now, every));
        }
    }
}
