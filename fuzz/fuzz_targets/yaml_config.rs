//! libFuzzer entry point of [`linkbus_fuzz::yaml_config`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| linkbus_fuzz::yaml_config(data));
