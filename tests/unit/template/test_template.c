/* test_template.c — unit tests for the chat-template engine: control flow,
 * scoping, macros, whitespace control, expressions, errors with locations,
 * and the limits that keep hostile templates bounded.
 *
 * The table-driven expectations (CONTROL, WHITESPACE, EXPRESSIONS) were
 * produced by rendering the same sources with Python Jinja2 3.1 configured
 * as Hugging Face does (sandboxed, trim_blocks, lstrip_blocks,
 * loopcontrols), so they are Jinja's own output, not this engine's.
 */
#include <jansson.h>
#include <pthread.h>
#include <time.h>

#include "template/template.h"
#include "template_cases.h"
#include "test.h"

/* Expects failure with status st and msg containing `want` (NULL: any). */
static void expect_fail(const char *src, const char *ctx, size_t max_out, ns_status want_st, const char *want) {
    ns_error err;
    ns_status st;
    char *out = render_ctx(src, ctx, max_out, &st, &err);
    CHECKF(out == NULL, "%s rendered [%s] but should fail", src, out ? out : "");
    CHECKF(st == want_st, "%s: status %s, want %s (%s)", src, ns_status_name(st), ns_status_name(want_st), err.msg);
    if (want) CHECKF(strstr(err.msg, want) != NULL, "%s: message [%s] lacks [%s]", src, err.msg, want);
    free(out);
}

static const rcase CONTROL[] = {
    {"{% if x %}a{% elif y %}b{% else %}c{% endif %}",
     "{\"x\": 0, \"y\": 1}",
     "b"},
    {"{% if x %}a{% elif y %}b{% else %}c{% endif %}",
     "{}",
     "c"},
    {"{% for m in messages %}{{ loop.index }}:{{ m.role }}{% if not loop.last %},{% endif %}{% endfor %}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\", \"n\": 2}]}",
     "1:system,2:user,3:assistant"},
    {"{% for m in messages %}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\", \"n\": 2}]}",
     "032TrueFalse3|121FalseFalse3|210FalseTrue3|"},
    {"{% for m in messages %}{{ loop.previtem.role if loop.previtem is defined else '^' }}>{{ loop.nextitem.role if loop.nextitem is defined else '$' }} {% endfor %}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\", \"n\": 2}]}",
     "^>user system>assistant user>$ "},
    {"{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}={{ m.content }} {% endfor %}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\", \"n\": 2}]}",
     "1/2=hi 2/2=yo "},
    {"{% for x in [] %}x{% else %}empty{% endfor %}",
     "{}",
     "empty"},
    {"{% for x in missing %}x{% else %}empty-undefined{% endfor %}",
     "{}",
     "empty-undefined"},
    {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
     "{\"d\": {\"a\": 1, \"b\": {\"c\": \"x\"}, \"items\": [1, 2]}, \"l\": [3, 1, 2], \"s\": \"Hello World\", \"n\": null}",
     "a=1;b={'c': 'x'};items=[1, 2];"},
    {"{% for k in d %}{{ k }} {% endfor %}",
     "{\"d\": {\"a\": 1, \"b\": {\"c\": \"x\"}, \"items\": [1, 2]}, \"l\": [3, 1, 2], \"s\": \"Hello World\", \"n\": null}",
     "a b items "},
    {"{% for c in 'h\303\251!' %}[{{ c }}]{% endfor %}",
     "{}",
     "[h][\303\251][!]"},
    {"{% for i in [1, 2] %}{{ i }}{% break %}{% else %}[else after break]{% endfor %}|{% for i in [1, 2] %}{{ i }}{% else %}E{% endfor %}|{% for i in [1, 2] %}{% continue %}{% else %}[all continued]{% endfor %}",
     "{}",
     "1[else after break]|12|[all continued]"},
    {"{% for i in range(10) %}{% if i is odd %}{% continue %}{% endif %}{% if i > 6 %}{% break %}{% endif %}{{ i }}{% endfor %}",
     "{}",
     "0246"},
    {"{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}",
     "{}",
     "1x1 1y2 1|2x1 2y2 2|"},
    {"{% for i in l %}{{ loop.cycle('odd', 'even') }} {% endfor %}",
     "{\"d\": {\"a\": 1, \"b\": {\"c\": \"x\"}, \"items\": [1, 2]}, \"l\": [3, 1, 2], \"s\": \"Hello World\", \"n\": null}",
     "odd even odd "},
    {"{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}",
     "{}",
     "12121"},
    {"{% set x = 5 %}{% if true %}{% set x = 6 %}{% endif %}{{ x }}",
     "{}",
     "6"},
    {"{% set a, b = 1, 'two' %}{{ a }} {{ b }}",
     "{}",
     "1 two"},
    {"{% set ns = namespace(count=0, last=none) %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% set ns.last = m.role %}{% endfor %}{{ ns.count }} {{ ns.last }}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\", \"n\": 2}]}",
     "3 assistant"},
    {"{% set ns = namespace(s='') %}{% for i in range(3) %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.s }}",
     "{}",
     "012"},
    {"{% set block %}  inner {{ 1 + 1 }}  {% endset %}[{{ block }}]",
     "{}",
     "[  inner 2  ]"},
    {"{% set up | upper %}shout{% endset %}{{ up }}",
     "{}",
     "SHOUT"},
    {"{% macro greet(name, greeting='Hello', punct='!') %}{{ greeting }}, {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ greet('Al', punct='?') }} {{ greet(greeting='Yo', name='X') }}",
     "{}",
     "Hello, Bob! Hello, Al? Yo, X!"},
    {"{% macro f(a, b=a ~ '+') %}{{ a }}{{ b }}{% endmacro %}{{ f('1') }} {{ f('1', '2') }} {{ f() }}",
     "{}",
     "11+ 12 +"},
    {"{% macro count(n) %}{% if n > 0 %}{{ n }}{{ count(n - 1) }}{% endif %}{% endmacro %}{{ count(4) }}",
     "{}",
     "4321"},
    {"{% macro show() %}{{ x }}{% endmacro %}{% set x = 'late' %}{{ show() }}",
     "{}",
     "late"},
    {"{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ 1 }}{% endcall %}",
     "{}",
     "<b>bold 1</b>"},
    {"{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(v) each([1, 2]) %}<{{ v }}>{% endcall %}",
     "{}",
     "<1><2>"},
    {"{% macro v() %}{{ varargs }} {{ kwargs }}{% endmacro %}{{ v(1, 2, k='w') }}",
     "{}",
     "(1, 2) {'k': 'w'}"},
    {"{% filter upper %}hello {{ s }}{% endfilter %}",
     "{\"d\": {\"a\": 1, \"b\": {\"c\": \"x\"}, \"items\": [1, 2]}, \"l\": [3, 1, 2], \"s\": \"Hello World\", \"n\": null}",
     "HELLO HELLO WORLD"},
    {"{% with a = 5, b = 'x' %}{{ a }}{{ b }}{% endwith %}[{{ a }}]",
     "{}",
     "5x[]"},
    {"{% generation %}kept{% endgeneration %}",
     "{}",
     "kept"},
    {"{% raw %}{{ not evaluated }} {% if %}{% endraw %}!",
     "{}",
     "{{ not evaluated }} {% if %}!"},
    {"a{# comment #}b{#- trimmed -#}  c",
     "{}",
     "abc"},
    {"{% for n in tree recursive %}<{{ n.name }}:{{ loop.depth }}{% if n.kids %}[{{ loop(n.kids) }}]{% endif %}>{% endfor %}",
     "{\"tree\": [{\"name\": \"a\", \"kids\": [{\"name\": \"a1\"}, {\"name\": \"a2\", \"kids\": [{\"name\": \"a21\"}]}]}, {\"name\": \"b\", \"kids\": [{\"name\": \"b1\"}]}, {\"name\": \"c\"}]}",
     "<a:1[<a1:2><a2:2[<a21:3>]>]><b:1[<b1:2>]><c:1>"},
    {"{% for n in tree if n.name != 'b' recursive %}{{ loop.index }}{{ n.name }}{{ loop(n.kids or [])|upper }}{% endfor %}",
     "{\"tree\": [{\"name\": \"a\", \"kids\": [{\"name\": \"a1\"}, {\"name\": \"a2\", \"kids\": [{\"name\": \"a21\"}]}]}, {\"name\": \"b\", \"kids\": [{\"name\": \"b1\"}]}, {\"name\": \"c\"}]}",
     "1a1A12A21A212c"},
};

static const rcase WHITESPACE[] = {
    {"{% if true %}\n  yes\n{% endif %}\nafter",
     "{}",
     "  yes\nafter"},
    {"  {% if true %}\n    x\n  {% endif %}\nend",
     "{}",
     "    x\nend"},
    {"line\n    {% for i in [1, 2] %}\n    item {{ i }}\n    {% endfor %}\ndone",
     "{}",
     "line\n    item 1\n    item 2\ndone"},
    {"a  {%- if true %}  b  {% endif -%}  c",
     "{}",
     "a  b  c"},
    {"{%- for i in [1, 2] -%}\n  {{ i }}\n{%- endfor %}",
     "{}",
     "12"},
    {"  {{ 'v' }}  {% if true %}t{% endif %}",
     "{}",
     "  v  t"},
    {"x {# c #} y\n   {#- c2 #}  z",
     "{}",
     "x  y  z"},
    {"{%+ if true %}  \nkeep{%- endif %}",
     "{}",
     "  \nkeep"},
    {"  {%+ if true %}kept indent{% endif %}",
     "{}",
     "  kept indent"},
    {"{% if true +%}\nnewline kept{% endif %}",
     "{}",
     "\nnewline kept"},
    {"{{- ' a ' -}}   \n\n  {{- ' b ' }}",
     "{}",
     " a  b "},
    {"text\n",
     "{}",
     "text"},
    {"text\n\n",
     "{}",
     "text\n"},
    {"crlf\015\nline\015\n{% if true %}\015\nx{% endif %}",
     "{}",
     "crlf\nline\nx"},
    {"\t{% if true %}tab{% endif %}",
     "{}",
     "tab"},
    {"{% if true %}   \nx{% endif %}",
     "{}",
     "   \nx"},
};

static const rcase EXPRESSIONS[] = {
    {"{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** -1 }}",
     "{}",
     "7 9 3 -4 1 2 1024 3.5 2.0 0.5"},
    {"{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-5 }} {{ 1.0 }} {{ 1 / 3 }} {{ 2.5e-7 }} {{ -0.0 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}",
     "{}",
     "0.30000000000000004 1e+16 1000000000000000.0 1e-05 1.0 0.3333333333333333 2.5e-07 -0.0 3.0 0.5"},
    {"{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 2 }} {{ [1] + [2] }} {{ [0] * 3 }} {{ 'x' + 'y' }}",
     "{}",
     "a1NoneTrue abab [1, 2] [0, 0, 0] xy"},
    {"{{ 1 < 2 < 3 }} {{ 3 > 2 > 5 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }} {{ [1, 2] == [1, 2] }} {{ 'abc' < 'abd' }} {{ none == none }}",
     "{}",
     "True False True True True True True True"},
    {"{{ 'ell' in s }} {{ 'x' not in s }} {{ 2 in l }} {{ 'a' in d }} {{ 'z' in d }} {{ 1 in [] }}",
     "{\"d\": {\"a\": 1, \"b\": {\"c\": \"x\"}, \"items\": [1, 2]}, \"l\": [3, 1, 2], \"s\": \"Hello World\", \"n\": null}",
     "True True True True False False"},
    {"{{ not n }} {{ n or 'fallback' }} {{ s and 'yes' }} {{ 0 or '' or 'last' }} {{ [] and 'x' }}",
     "{\"d\": {\"a\": 1, \"b\": {\"c\": \"x\"}, \"items\": [1, 2]}, \"l\": [3, 1, 2], \"s\": \"Hello World\", \"n\": null}",
     "True fallback yes last []"},
    {"{{ 'T' if s else 'F' }} {{ 'T' if n else 'F' }} [{{ 'only' if false }}]",
     "{\"d\": {\"a\": 1, \"b\": {\"c\": \"x\"}, \"items\": [1, 2]}, \"l\": [3, 1, 2], \"s\": \"Hello World\", \"n\": null}",
     "T F []"},
    {"{{ \"esc\\\"aped\" }} {{ 'it\\'s' }} {{ 'tab\\tnl\\nuni\\u00e9\\x41' }} {{ 'a' 'b' \"c\" }} {{ '\\\\d' }}",
     "{}",
     "esc\"aped it's tab\tnl\nuni\303\251A abc \\d"},
    {"{{ [1, 'a', none, true, (1,), {'k': \"it's\"}] }} {{ () }} {{ (1, 2) }} {{ {} }}",
     "{}",
     "[1, 'a', None, True, (1,), {'k': \"it's\"}] () (1, 2) {}"},
    {"{{ d.a }} {{ d['a'] }} {{ d.b.c }} {{ d['b']['c'] }} {{ l[0] }} {{ l[-1] }} {{ l.1 }} {{ messages[1].content }}",
     "{\"d\": {\"a\": 1, \"b\": {\"c\": \"x\"}, \"items\": [1, 2]}, \"l\": [3, 1, 2], \"s\": \"Hello World\", \"n\": null, \"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\", \"n\": 2}]}",
     "1 1 x x 3 2 1 hi"},
    {"[{{ d.missing }}] [{{ l[10] }}] [{{ n.attr }}] [{{ s.nope }}] {{ d.missing is defined }} {{ d.b.c is defined }}",
     "{\"d\": {\"a\": 1, \"b\": {\"c\": \"x\"}, \"items\": [1, 2]}, \"l\": [3, 1, 2], \"s\": \"Hello World\", \"n\": null}",
     "[] [] [] [] False True"},
    {"{{ d.items is callable }} {{ d['items'] }} {{ d.items()|list }}",
     "{\"d\": {\"items\": [1, 2]}}",
     "True [1, 2] [('items', [1, 2])]"},
    {"{{ l[1:] }} {{ l[:2] }} {{ l[::-1] }} {{ l[-2:] }} {{ l[::2] }} {{ l[5:] }} {{ s[::-1] }} {{ s[1:4] }} {{ s[-5:] }}",
     "{\"d\": {\"a\": 1, \"b\": {\"c\": \"x\"}, \"items\": [1, 2]}, \"l\": [3, 1, 2], \"s\": \"Hello World\", \"n\": null}",
     "[1, 2] [3, 1] [2, 1, 3] [1, 2] [3, 2] [] dlroW olleH ell World"},
    {"{{ u[1] }} {{ u[::-1] }} {{ u[2:5] }} {{ u|length }}",
     "{\"u\": \"h\303\251llo \344\275\240\345\245\275 \360\237\221\215\"}",
     "\303\251 \360\237\221\215 \345\245\275\344\275\240 oll\303\251h llo 10"},
    {"{{ 1_000 + 0x10 }} {{ 1.5e3 }} {{ 10 // 3.0 }} {{ -(3) }} {{ +4 }} {{ -2 ** 2 }} {{ 2 ** 3 ** 2 }}",
     "{}",
     "1016 1500.0 3.0 -3 4 4 64"},
    {"{{ none }} {{ true }} {{ False }} {{ None }} {{ undefined_var }}|",
     "{}",
     "None True False None |"},
    {"{% set ns = namespace(v=0) %}{% set ns.v = ns %}{% set ns.w = [ns] %}{{ ns }}",
     "{}",
     "<Namespace {'v': <Namespace {...}>, 'w': [<Namespace {...}>]}>"},
    {"{{ x is defined }} {{ x is undefined }} {{ n is none }} {{ s is string }} {{ d is mapping }} {{ l is sequence }} {{ l is iterable }} {{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is boolean }}",
     "{\"d\": {\"a\": 1, \"b\": {\"c\": \"x\"}, \"items\": [1, 2]}, \"l\": [3, 1, 2], \"s\": \"Hello World\", \"n\": null}",
     "False True True True True True True True True True True"},
    {"{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 'a' is in 'abc' }} {{ 2 is eq 2 }} {{ 2 is equalto 3 }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ none is sameas none }} {{ 'up' is lower }} {{ 'UP' is upper }}",
     "{}",
     "True True True True True False True False True True True True"},
    {"{{ 5 is gt 3 }} {{ 5 is lt 3 }} {{ 5 is ge 5 }} {{ 5 is le 4 }} {{ 5 is ne 4 }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ 'nosuch' is filter }} {{ x is not none }}",
     "{}",
     "True False True False True True True False True"},
    {"{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ dict(a=1, b=2) }} {{ namespace(x=1).x }}",
     "{}",
     "[0, 1, 2] [1, 4, 7] [5, 3, 1] {'a': 1, 'b': 2} 1"},
    {"{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }} {% set j = joiner(' | ') %}{% for i in [1, 2, 3] %}{{ j() }}{{ i }}{% endfor %}",
     "{}",
     "abab 1 | 2 | 3"},
};

TEST(control_flow_and_scoping) { RUN_TABLE(CONTROL); }
TEST(whitespace_control) { RUN_TABLE(WHITESPACE); }
TEST(expressions_and_tests) { RUN_TABLE(EXPRESSIONS); }

TEST(syntax_error_names_line_and_column) {
    expect_fail("{% if x %}\n  {{ 1 + }}\n{% endif %}", NULL, 0, NS_ERR_FORMAT, "template:2:10: ");
    expect_fail("{% for x in y %}abc", NULL, 0, NS_ERR_FORMAT, "expected 'endfor'");
    expect_fail("ok\n{% frobnicate %}", NULL, 0, NS_ERR_FORMAT, "template:2:4: Encountered unknown tag 'frobnicate'");
    expect_fail("{{ 'unterminated }}", NULL, 0, NS_ERR_FORMAT, "template:1:4: unterminated string");
    expect_fail("{{ (1 }}", NULL, 0, NS_ERR_FORMAT, "template:1:");
    expect_fail("{# never closed", NULL, 0, NS_ERR_FORMAT, "comment");
    expect_fail("{% break %}", NULL, 0, NS_ERR_FORMAT, "outside of a loop");
    expect_fail("{% for i in [1] %}{{ loop([2]) }}{% endfor %}", "{}", 0, NS_ERR_INVALID, "'recursive' marker");
    expect_fail("{{ a is defined is defined }}", NULL, 0, NS_ERR_FORMAT, "chain");
    expect_fail("{% macro m(a=1, b) %}{% endmacro %}", NULL, 0, NS_ERR_FORMAT, "non-default");
    /* the parse error text is what the API returns directly */
    ns_template *t = NULL;
    ns_error err = {0};
    CHECK(ns_template_parse("a\n\n  {% endif %}", strlen("a\n\n  {% endif %}"), &t, &err) == NS_ERR_FORMAT);
    CHECK(t == NULL);
    CHECK_EQ_STR(err.msg, "template:3:6: Encountered unknown tag 'endif'");
    CHECK(ns_template_parse("bad \xff utf8", 10, &t, &err) == NS_ERR_FORMAT);
}

TEST(runtime_errors_name_line_and_column) {
    expect_fail("line one\n  {{ nofunc(1) }}", "{}", 0, NS_ERR_INVALID, "template:2:6: 'nofunc' is undefined");
    expect_fail("{{ foo.bar }}", "{}", 0, NS_ERR_INVALID, "'foo' is undefined");
    expect_fail("{% set d = {'a': 1} %}\n{{ d.missing.deeper }}", "{}", 0, NS_ERR_INVALID,
                "template:2:");
    expect_fail("{{ 1 + 'a' }}", "{}", 0, NS_ERR_INVALID, "unsupported operand type(s) for +: 'int' and 'str'");
    expect_fail("{{ 'a' < 1 }}", "{}", 0, NS_ERR_INVALID, "not supported between instances of 'str' and 'int'");
    expect_fail("{{ 1 // 0 }}", "{}", 0, NS_ERR_INVALID, "division or modulo by zero");
    expect_fail("{% for x in n %}{% endfor %}", "{\"n\": null}", 0, NS_ERR_INVALID, "'NoneType' object is not iterable");
    expect_fail("{% for a, b in [[1, 2, 3]] %}{% endfor %}", "{}", 0, NS_ERR_INVALID, "too many values to unpack");
    expect_fail("{{ l.append(4) }}", "{\"l\": [1]}", 0, NS_ERR_INVALID,
                "access to attribute 'append' of 'list' object is unsafe.");
    expect_fail("{{ d.update({}) }}", "{\"d\": {}}", 0, NS_ERR_INVALID, "unsafe");
    expect_fail("{% set x = 1 %}{% set x.y = 2 %}", "{}", 0, NS_ERR_INVALID, "non-namespace");
    expect_fail("{{ x|tojson }}", "{}", 0, NS_ERR_INVALID, "Object of type Undefined is not JSON serializable");
    expect_fail("{{ 1|no_such_filter }}", "{}", 0, NS_ERR_UNSUPPORTED, "No filter named 'no_such_filter'");
    expect_fail("{{ 1 is no_such_test }}", "{}", 0, NS_ERR_UNSUPPORTED, "No test named");
    /* an unknown filter in a branch that never runs costs nothing */
    ns_error err;
    ns_status st;
    char *out = render_ctx("{% if false %}{{ 1|no_such_filter }}{% endif %}ok", "{}", 0, &st, &err);
    CHECK(st == NS_OK && out && strcmp(out, "ok") == 0);
    free(out);
}

TEST(raise_exception_passes_message_through) {
    const char *src = "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
                      "{{ raise_exception('Unsupported role: ' ~ m.role) }}{% endif %}{% endfor %}";
    expect_fail(src, "{\"messages\": [{\"role\": \"user\"}, {\"role\": \"robot\"}]}", 0, NS_ERR_INVALID, NULL);
    ns_error err;
    ns_status st;
    char *out = render_ctx(src, "{\"messages\": [{\"role\": \"robot\"}]}", 0, &st, &err);
    CHECK(out == NULL && st == NS_ERR_INVALID);
    CHECK_EQ_STR(err.msg, "Unsupported role: robot");
    out = render_ctx(src, "{\"messages\": [{\"role\": \"user\"}]}", 0, &st, &err);
    CHECK(st == NS_OK && out && out[0] == 0);
    free(out);
}

TEST(limits_stop_hostile_templates) {
    time_t start = time(NULL);
    expect_fail("{% for i in range(100000000) %}x{% endfor %}", "{}", 0, NS_ERR_RANGE, "Range too big");
    /* nested loops: the step budget (or memory cap) ends it quickly */
    ns_error err;
    ns_status st;
    char *out = render_ctx("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "{}",
                           1 << 20, &st, &err);
    CHECK(out == NULL);
    CHECKF(st == NS_ERR_RANGE || st == NS_ERR_NOMEM, "nested loops: %s", err.msg);
    free(out);
    expect_fail("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", "{}", 0, NS_ERR_RANGE, "recursion depth");
    expect_fail("{% for i in range(1000) %}0123456789{% endfor %}", "{}", 100, NS_ERR_NOMEM, "output exceeds");
    expect_fail("{{ 'x' * 10000000000 }}", "{}", 1 << 20, NS_ERR_NOMEM, "memory");
    expect_fail("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                "{% endfor %}{{ ns.s|length }}",
                "{}", 1 << 20, NS_ERR_NOMEM, "memory");
    CHECKF(time(NULL) - start < 20, "limits took %ld s", (long)(time(NULL) - start));
}

TEST(limits_deep_nesting) {
    /* deeply nested source is a syntax error, not a stack overflow */
    char src[4096];
    size_t o = 0;
    o += (size_t)sprintf(src + o, "{{ ");
    for (int i = 0; i < 1000; i++) src[o++] = '(';
    src[o++] = '1';
    for (int i = 0; i < 1000; i++) src[o++] = ')';
    o += (size_t)sprintf(src + o, " }}");
    src[o] = 0;
    expect_fail(src, "{}", 0, NS_ERR_FORMAT, "nested too deeply");
    o = 0;
    for (int i = 0; i < 300; i++) o += (size_t)sprintf(src + o, "{%% if 1 %%}");
    src[o] = 0;
    expect_fail(src, "{}", 0, NS_ERR_FORMAT, "nested too deeply");
    o = (size_t)sprintf(src, "{{ ");
    for (int i = 0; i < 600; i++) o += (size_t)sprintf(src + o, "not ");
    sprintf(src + o, "1 }}");
    expect_fail(src, "{}", 0, NS_ERR_FORMAT, "nested too deeply");
    /* a self-nesting value prints and compares without recursing forever */
    ns_error err;
    ns_status st;
    char *out = render_ctx("{% set ns = namespace(x=1) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}"
                           "{{ (ns.x|string)|length > 0 }} {{ ns.x == ns.x }}",
                           "{}", 0, &st, &err);
    CHECKF(st == NS_OK && out && strcmp(out, "True True") == 0, "%s / %s", out ? out : "(null)", err.msg);
    free(out);
    expect_fail("{% set ns = namespace(x=1) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}"
                "{{ ns.x|tojson }}",
                "{}", 0, NS_ERR_RANGE, "nested too deeply");
    out = render_ctx("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns|string|length > 10 }}", "{}", 0, &st, &err);
    CHECKF(st == NS_OK && out && strcmp(out, "True") == 0, "%s", err.msg);
    free(out);
}

TEST(api_contract) {
    ns_template *t = NULL;
    ns_error err = {0};
    const char *src = "{{ greeting }}, {{ who|default('world') }}!";
    CHECK(ns_template_parse(src, strlen(src), &t, &err) == NS_OK);
    char *out = NULL;
    size_t len = 99;
    /* NULL context: everything undefined */
    CHECK(ns_template_render(t, NULL, 0, &out, &len, &err) == NS_OK);
    CHECK_EQ_STR(out, ", world!");
    CHECK_EQ_INT(len, 8);
    free(out);
    /* the context is borrowed and left untouched */
    json_t *ctx = json_pack("{s:s, s:[i, f]}", "greeting", "Hi", "extra", 1, 2.5);
    char *before = json_dumps(ctx, JSON_SORT_KEYS);
    CHECK(ns_template_render(t, ctx, 0, &out, &len, &err) == NS_OK);
    CHECK_EQ_STR(out, "Hi, world!");
    CHECK_EQ_INT(len, strlen(out));
    char *after = json_dumps(ctx, JSON_SORT_KEYS);
    CHECK_EQ_STR(before, after);
    CHECK_EQ_INT(ctx->refcount, 1);
    free(before);
    free(after);
    free(out);
    json_t *arr = json_array();
    out = (char *)1;
    CHECK(ns_template_render(t, arr, 0, &out, &len, &err) == NS_ERR_INVALID);
    CHECK(out == NULL);
    json_decref(arr);
    json_decref(ctx);
    ns_template_free(t);
    ns_template_free(NULL);
    /* empty template renders to "" */
    CHECK(ns_template_parse("", 0, &t, &err) == NS_OK);
    CHECK(ns_template_render(t, NULL, 0, &out, NULL, &err) == NS_OK);
    CHECK_EQ_STR(out, "");
    free(out);
    ns_template_free(t);
}

TEST(strftime_now_and_dates) {
    char year[8];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(year, sizeof year, "%Y", &tm);
    ns_error err;
    ns_status st;
    char *out = render_ctx("{{ strftime_now('%Y') }}|{{ strftime_now('%d %b %Y')|length }}", "{}", 0, &st, &err);
    CHECK(st == NS_OK && out);
    if (out) {
        CHECK(strncmp(out, year, 4) == 0);
        CHECK_EQ_STR(out + 4, "|11");
    }
    free(out);
    /* Llama 3.1's pattern: date_string wins when given, else a default */
    const char *src = "{% if not date_string is defined %}{% set date_string = '26 Jul 2024' %}{% endif %}"
                      "Today Date: {{ date_string }}";
    out = render_ctx(src, "{}", 0, &st, &err);
    CHECK_EQ_STR(out, "Today Date: 26 Jul 2024");
    free(out);
    out = render_ctx(src, "{\"date_string\": \"01 Jan 2025\"}", 0, &st, &err);
    CHECK_EQ_STR(out, "Today Date: 01 Jan 2025");
    free(out);
}

typedef struct {
    const ns_template *t;
    json_t *ctx;
    int ok;
} thread_arg;

static void *render_thread(void *p) {
    thread_arg *a = p;
    a->ok = 1;
    for (int i = 0; i < 200; i++) {
        char *out = NULL;
        ns_error err;
        if (ns_template_render(a->t, a->ctx, 0, &out, NULL, &err) != NS_OK || strcmp(out, "a|b|c") != 0) a->ok = 0;
        free(out);
    }
    return NULL;
}

TEST(concurrent_renders_share_a_template) {
    const char *src = "{% set ns = namespace(parts=[]) %}{% for x in xs %}{% set ns.parts = ns.parts + [x] %}"
                      "{% endfor %}{{ ns.parts|join('|') }}";
    ns_template *t = NULL;
    ns_error err;
    CHECK(ns_template_parse(src, strlen(src), &t, &err) == NS_OK);
    json_t *ctx = json_pack("{s:[s,s,s]}", "xs", "a", "b", "c");
    pthread_t th[4];
    thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i].t = t;
        args[i].ctx = ctx;
        pthread_create(&th[i], NULL, render_thread, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(args[i].ok);
    }
    json_decref(ctx);
    ns_template_free(t);
}

typedef struct {
    ns_status deep, shallow;
    char msg[512];
} small_stack_result;

static void *render_on_small_stack(void *p) {
    small_stack_result *r = p;
    ns_error err;
    char *out = render_ctx("{% macro r(n) %}{% for i in [1] %}{% if true %}{{ ((n + 1)) ~ r(n + 1) }}{% endif %}"
                           "{% endfor %}{% endmacro %}{{ r(0) }}",
                           "{}", 0, &r->deep, &err);
    snprintf(r->msg, sizeof r->msg, "%s", err.msg);
    free(out);
    out = render_ctx("{% for m in messages %}{{ m.role }}:{{ m.content|trim }};{% endfor %}",
                     "{\"messages\": [{\"role\": \"user\", \"content\": \" hi \"}]}", 0, &r->shallow, &err);
    if (r->shallow == NS_OK && strcmp(out, "user:hi;") != 0) r->shallow = NS_ERR_INTERNAL;
    free(out);
    return NULL;
}

TEST(small_thread_stack_fails_cleanly) {
    /* a server worker may have a small stack: deep recursion must stop with
     * an error before it overflows, while ordinary templates still render */
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 * 1024);
    pthread_t th;
    small_stack_result r = {0};
    CHECK(pthread_create(&th, &at, render_on_small_stack, &r) == 0);
    pthread_join(th, NULL);
    pthread_attr_destroy(&at);
    CHECKF(r.deep == NS_ERR_RANGE, "deep: %s (%s)", ns_status_name(r.deep), r.msg);
    CHECK(r.shallow == NS_OK);
}

int main(void) {
    RUN(control_flow_and_scoping);
    RUN(whitespace_control);
    RUN(expressions_and_tests);
    RUN(syntax_error_names_line_and_column);
    RUN(runtime_errors_name_line_and_column);
    RUN(raise_exception_passes_message_through);
    RUN(limits_stop_hostile_templates);
    RUN(limits_deep_nesting);
    RUN(api_contract);
    RUN(strftime_now_and_dates);
    RUN(concurrent_renders_share_a_template);
    RUN(small_thread_stack_fails_cleanly);
    TEST_MAIN_END;
}
