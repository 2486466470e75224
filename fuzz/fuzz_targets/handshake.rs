//! libFuzzer entry point of [`linkbus_fuzz::handshake`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| linkbus_fuzz::handshake(data));
