//! ringlb-apisim: a Kubernetes API simulator for tests and `make demo`.
fn main() {}
