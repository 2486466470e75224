//! The integration tests: real node processes (and nodes in this process) over real
//! sockets and stores, in one test binary so the suite links the node once.

mod support;

mod acknowledgement;
mod bad_input;
mod bench;
mod clock_skew;
mod codecs;
mod config_rejection;
mod dead_letters;
mod delivery_faults;
mod demo;
mod disk_full;
mod durability;
mod events;
mod files;
mod filters;
mod flags;
mod groups;
mod handshake_flood;
mod in_process;
mod link_faults;
mod link_reset;
mod multi_host;
mod native;
mod priority;
mod put_limits;
mod put_modes;
mod queue_commands;
mod reconnect;
mod results;
mod routing;
mod security;
mod stages;
mod streaming;
mod transactions;
mod two_nodes;
