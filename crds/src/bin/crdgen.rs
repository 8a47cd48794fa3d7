//! Writes the CRD YAML generated from the types. Filled in by the CRD work.
fn main() {}
