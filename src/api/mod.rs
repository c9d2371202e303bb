//! How Envoy asks: `ShouldRateLimit` over gRPC and `POST /json`, and the protobuf shapes
//! both speak.

pub(crate) mod grpc;
pub(crate) mod json;
pub(crate) mod proto;
