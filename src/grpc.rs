//! The gRPC adapter: `envoy.service.ratelimit.v3.RateLimitService` over [`Rls`].

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_core::DecideError;
use tonic::{Request, Response, Status};

use crate::rls::{Rls, RlsError};

/// Serves [`Rls`] to Envoy.
#[derive(Clone)]
pub(crate) struct GrpcService(Arc<Rls>);

impl GrpcService {
    pub(crate) fn server(rls: Arc<Rls>) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(Self(rls))
    }
}

#[tonic::async_trait]
impl RateLimitService for GrpcService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.0
            .should_rate_limit(request.get_ref())
            .await
            .map(Response::new)
            .map_err(|e| match e {
                // UNKNOWN, as the reference answers before its first config.
                RlsError::NoRules => Status::unknown(e.to_string()),
                RlsError::Decide(DecideError::InvalidArgument(why)) => {
                    Status::invalid_argument(why.to_string())
                }
                RlsError::Decide(DecideError::Store(e)) => Status::unavailable(e.to_string()),
            })
    }
}
