//! The gRPC adapter: `envoy.service.ratelimit.v3.RateLimitService` over [`Service`].

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use super::{DecideError, Service};

/// Serves [`Service`] to Envoy.
#[derive(Debug, Clone)]
pub struct GrpcService(pub Arc<Service>);

impl GrpcService {
    pub fn server(service: Arc<Service>) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(Self(service))
    }
}

#[tonic::async_trait]
impl RateLimitService for GrpcService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.0
            .decide(request.get_ref())
            .await
            .map(Response::new)
            .map_err(|e| match e {
                DecideError::InvalidArgument(why) => Status::invalid_argument(why),
                DecideError::Store(e) => Status::unavailable(e.to_string()),
            })
    }
}
