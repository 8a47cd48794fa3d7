//! Maglev consistent hashing (Eisenbud et al., NSDI 2016, §3.4). Pure, no I/O.
