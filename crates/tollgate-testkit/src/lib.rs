//! Test support for Tollgate's test suites and benchmarks: real child processes
//! (Tollgate, redis-server, Envoy) on loopback, and the clients that talk to them.
