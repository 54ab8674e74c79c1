//! Layout and binding tests: readable position tables as insta snapshots, unit tests of the
//! layout and binding rules, and every example schema and prompt of `schemas/` laid out and bound.

mod bind_tests;
mod examples;
mod layout_tests;
mod never_panics;
mod support;
