"""BlueGreen on the data plane (tests/support/e2e/blue_green.py): a prefill/decode graph's two
generations, as the hook renders them mid-rollout, run at once in the sandbox; each router sees
only its own generation's workers, and a stream of chat completions through the front door
across its switch, and across the old generation's removal, never fails nor mixes generations."""

from tests.support.e2e import blue_green, sandbox
from tests.support.e2e.tokenizer import build_tokenizer
from tests.support.prerequisites import need_schemas


def test_prefill_decode_generations_switch_under_a_stream_of_requests(hooks) -> None:
    sandbox.need_sandbox()
    need_schemas()
    with sandbox.workdir() as workdir:
        output = blue_green.run(hooks, workdir, build_tokenizer(workdir / "model"))
    print(output)
    assert "scenario blue_green:serves_across_the_switch passed" in output
