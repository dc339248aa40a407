//! `GET /api/v1/grants` and `DELETE /api/v1/grants/{id}`: a namespace's
//! live grants (an approver key: every namespace's), newest first, and
//! their revoke (204; 404 `no_such_grant` for an id the caller cannot
//! see). Refusals are JSON (`error_type`, `message`).

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};

use super::access::Caller;
use super::error::ChatError;
use super::forward::client_address;
use super::state::AppState;
use crate::run::grants::GrantsOf;

/// Whose grants `caller` sees: its namespace's, or an approver's scope
/// (its `namespaces=`, as its inbox).
fn whose(state: &AppState, caller: Caller) -> GrantsOf {
    match caller {
        Caller::Owner(owner) => GrantsOf::Namespace(owner),
        Caller::Approver(_) => GrantsOf::Approver(state.access.namespaces(caller)),
    }
}

pub async fn list(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let listed = async {
        let caller = state.access.json_caller(req.headers())?;
        let grants = state
            .runs
            .grants()
            .list(whose(&state, caller))
            .await
            .map_err(|_| ChatError::StoreUnreachable)?;
        let mut response = HttpResponse::Ok()
            .insert_header((header::CACHE_CONTROL, "no-store"))
            .json(serde_json::json!({ "grants": grants }));
        state.access.allow_origin(req.headers(), &mut response);
        Ok::<_, ChatError>(response)
    };
    listed.await.unwrap_or_else(|err| {
        state.runs.metrics().error(err.error_type());
        err.to_json_response()
    })
}

pub async fn revoke(
    req: HttpRequest,
    id: web::Path<String>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let revoked = async {
        let caller = state.access.json_caller(req.headers())?;
        let client = client_address(&req, false);
        let found = state
            .runs
            .grants()
            .revoke(
                whose(&state, caller),
                &id,
                &state.access.label(caller),
                client.as_deref(),
            )
            .await
            .map_err(|_| ChatError::StoreUnreachable)?;
        if !found {
            return Err(ChatError::NoSuchGrant);
        }
        let mut response = HttpResponse::NoContent().finish();
        state.access.allow_origin(req.headers(), &mut response);
        Ok(response)
    };
    revoked.await.unwrap_or_else(|err| {
        state.runs.metrics().error(err.error_type());
        err.to_json_response()
    })
}
