//! libFuzzer entry point of [`linkbus_fuzz::client_requests`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| linkbus_fuzz::client_requests(data));
