//! The BGP speaker: RFC 4271 FSM, sessions, announcements.
