//! Tracing over OpenTelemetry (`TRACING_ENABLED`), with the reference's settings: spans go
//! to an OTLP collector over HTTP or gRPC (`OTEL_EXPORTER_OTLP_ENDPOINT`, `…_HEADERS`, read
//! by the exporter as every OpenTelemetry SDK does), and a `ShouldRateLimit` span
//! continues the trace Envoy propagates (W3C `traceparent`, or B3). Spans are `tracing`
//! spans at debug level from Tollgate's crates, so the log output never formats them and,
//! with tracing off, nothing creates them.

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::SpanExporter;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tonic::metadata::MetadataMap;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use crate::config::settings::{ExporterProtocol, TracingArgs};

/// Exports spans until shut down; shutting down sends what is still buffered.
pub(crate) struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// The exporter and the layer that feeds it, per the settings. Must run inside the
    /// Tokio runtime (the gRPC exporter's connection lives there).
    pub(crate) fn start<S>(
        args: &TracingArgs,
    ) -> anyhow::Result<(Self, Box<dyn Layer<S> + Send + Sync>)>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        let exporter = match args.tracing_exporter_protocol {
            ExporterProtocol::Grpc => SpanExporter::builder().with_tonic().build(),
            ExporterProtocol::Http => SpanExporter::builder().with_http().build(),
        }
        .map_err(|e| anyhow::anyhow!("cannot set up the OTLP span exporter: {e}"))?;
        let instance = match args.tracing_service_instance_id.trim() {
            "" => random_uuid(),
            id => id.to_owned(),
        };
        let mut attributes = vec![KeyValue::new("service.instance.id", instance)];
        if !args.tracing_service_namespace.is_empty() {
            attributes.push(KeyValue::new(
                "service.namespace",
                args.tracing_service_namespace.clone(),
            ));
        }
        let resource = Resource::builder()
            .with_service_name(args.tracing_service_name.clone())
            .with_attributes(attributes)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                args.tracing_sampling_rate,
            ))))
            .with_resource(resource)
            .build();
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("tollgate"))
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                meta.is_span() && meta.target().starts_with("tollgate")
            }));
        Ok((Self { provider }, Box::new(layer)))
    }

    /// Sends the spans still buffered; blocks, so call it off the async workers.
    pub(crate) fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!("spans not all exported at shutdown: {e}");
        }
    }
}

/// The trace a request belongs to, from its gRPC metadata: W3C `traceparent` (with
/// `tracestate`), else B3 as one `b3` header or as `x-b3-*` headers.
pub(crate) fn incoming(metadata: &MetadataMap) -> Option<Context> {
    let headers = Headers(metadata);
    let w3c = TraceContextPropagator::new().extract(&headers);
    if w3c.span().span_context().is_valid() {
        return Some(w3c);
    }
    b3(&headers).map(|span| Context::new().with_remote_span_context(span))
}

/// B3, single header (`trace-span[-sampled[-parent]]`) or multiple headers.
fn b3(headers: &Headers<'_>) -> Option<SpanContext> {
    let (trace, span, sampled) = match headers.get("b3") {
        Some(single) => {
            let mut parts = single.split('-');
            (parts.next()?, parts.next()?, parts.next())
        }
        None => (
            headers.get("x-b3-traceid")?,
            headers.get("x-b3-spanid")?,
            headers
                .get("x-b3-flags")
                .filter(|f| *f == "1")
                .or_else(|| headers.get("x-b3-sampled")),
        ),
    };
    // 64-bit trace ids are left-padded to 128 bits, as B3 specifies.
    let trace = TraceId::from_hex(&format!("{trace:0>32}")).ok()?;
    let span = SpanId::from_hex(span).ok()?;
    let flags = match sampled {
        Some("1" | "d" | "true") => TraceFlags::SAMPLED,
        _ => TraceFlags::default(),
    };
    let context = SpanContext::new(trace, span, flags, true, TraceState::default());
    context.is_valid().then_some(context)
}

/// gRPC metadata as the propagator reads it.
struct Headers<'a>(&'a MetadataMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// A random version-4 UUID, the reference's default instance id.
fn random_uuid() -> String {
    let mut bytes: [u8; 16] = fastrand::u128(..).to_be_bytes();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use tonic::metadata::MetadataValue;

    use super::*;

    fn metadata(pairs: &[(&'static str, &'static str)]) -> MetadataMap {
        let mut map = MetadataMap::new();
        for (k, v) in pairs {
            map.insert(*k, MetadataValue::from_static(v));
        }
        map
    }

    fn ids(context: Option<Context>) -> Option<(String, String, bool)> {
        let context = context?;
        let span = context.span();
        let span = span.span_context();
        Some((
            span.trace_id().to_string(),
            span.span_id().to_string(),
            span.is_sampled(),
        ))
    }

    #[test]
    fn w3c_and_both_b3_forms_are_continued() {
        let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
        let w3c = metadata(&[(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )]);
        let want = Some((trace.to_owned(), "00f067aa0ba902b7".to_owned(), true));
        assert_eq!(ids(incoming(&w3c)), want);
        let single = metadata(&[("b3", "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1")]);
        assert_eq!(ids(incoming(&single)), want);
        let multi = metadata(&[
            ("x-b3-traceid", "4bf92f3577b34da6a3ce929d0e0e4736"),
            ("x-b3-spanid", "00f067aa0ba902b7"),
            ("x-b3-sampled", "1"),
        ]);
        assert_eq!(ids(incoming(&multi)), want);
        let short = metadata(&[("b3", "a3ce929d0e0e4736-00f067aa0ba902b7-0")]);
        assert_eq!(
            ids(incoming(&short)),
            Some((
                "0000000000000000a3ce929d0e0e4736".to_owned(),
                "00f067aa0ba902b7".to_owned(),
                false
            ))
        );
    }

    #[test]
    fn malformed_context_starts_no_trace() {
        for bad in [
            metadata(&[("traceparent", "00-zz-00f067aa0ba902b7-01")]),
            metadata(&[("b3", "not-a-trace")]),
            metadata(&[("b3", "00000000000000000000000000000000-00f067aa0ba902b7")]),
            metadata(&[("x-b3-traceid", "4bf92f3577b34da6a3ce929d0e0e4736")]),
            metadata(&[]),
        ] {
            assert_eq!(ids(incoming(&bad)), None, "{bad:?}");
        }
    }

    #[test]
    fn instance_ids_are_version_4_uuids() {
        let id = random_uuid();
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(&id[14..15], "4", "{id}");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "{id}");
        assert_ne!(id, random_uuid());
    }
}
