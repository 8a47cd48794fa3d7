//! ringlb-edge: the edge node's pieces. Pure logic (Maglev, desired state, the BGP
//! FSM) lives apart from the code that does I/O (datapath loaders, BGP sessions).

pub mod bgp;
pub mod datapath;
pub mod desired;
pub mod maglev;
pub mod plan;
