//! The packet datapath behind one trait: XDP (aya) or kernel IPVS.
