#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    quorumguard_testkit::fuzz::object_dump(data);
});
