//! Parse throughput on a generated schema of about 1 MB: many modules, unions and params, prose
//! and embedded Python with `<` and `<=` that must stay text.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::fmt::Write;
use std::hint::black_box;

const TARGET_BYTES: usize = 1 << 20;

fn generated_schema() -> String {
    let mut schema = String::from(
        "<?xml version=\"1.0\"?>\n<schema name=\"bench\">\n  <system>You are a careful assistant.</system>\n  <user>\n",
    );
    let mut index = 0;
    while schema.len() < TARGET_BYTES {
        let _ = write!(
            schema,
            r#"    <module name="doc-{index}">
      Document {index} talks about &lt;topics&gt; of &quot;interest&quot; for <param name="who-{index}" len="8"/>.
      <union default="short-{index}">
        <module name="short-{index}">A short summary of document {index}.</module>
        <module name="long-{index}">
          A longer summary, with a <parameter name="detail-{index}" length="16">scaffold text</parameter>.
        </module>
      </union>
      <module name="unit{index}.py">
        def clamp_{index}(x, low, high):
            # keeps 0 <= x < n, comparisons stay text
            if x < low:
                return low
            return high if x >= high else x
        <![CDATA[print(clamp_{index}(3, 0, 10) < 5 and "a" <b> "c")]]>
      </module>
      <!-- a comment that is dropped -->
    </module>
"#
        );
        index += 1;
    }
    schema.push_str("  </user>\n</schema>\n");
    schema
}

fn bench_parse(criterion: &mut Criterion) {
    let schema = generated_schema();
    let parsed = pml_syntax::parse(&schema);
    assert!(
        !parsed.has_errors(),
        "the benchmark input must be valid: {:?}",
        parsed.diagnostics.first()
    );
    let mut group = criterion.benchmark_group("parse");
    group.throughput(Throughput::Bytes(schema.len() as u64));
    group.sample_size(20);
    group.bench_function("generated_1mb_schema", |bencher| {
        bencher.iter(|| pml_syntax::parse(black_box(&schema)))
    });
    group.finish();
}

criterion_group!(benches, bench_parse);
criterion_main!(benches);
