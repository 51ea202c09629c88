#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    quorumguard::fuzz_targets::object_dump(data);
});
