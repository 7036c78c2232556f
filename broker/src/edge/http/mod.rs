//! TEMPORARY (codec branch): the lead provides the real mod.rs.
pub mod jsonrpc;
