//! libFuzzer entry point of [`linkbus_fuzz::link_frames`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| linkbus_fuzz::link_frames(data));
