# The two commands a new user needs: `make demo` and `make test`.
.PHONY: demo test test-localstack lint bootstrap clean

export AWS_ACCESS_KEY_ID ?= testing
export AWS_SECRET_ACCESS_KEY ?= testing
export AWS_DEFAULT_REGION ?= us-east-1
export AWS_EC2_METADATA_DISABLED = true
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION = 20
export CDK_DISABLE_VERSION_CHECK = 1
export CDK_DISABLE_CLI_TELEMETRY = true
export SPARK_LOCAL_IP = 127.0.0.1
export POWERTOOLS_TRACE_DISABLED = true
export POWERTOOLS_METRICS_NAMESPACE = DelayedDelivery
# Python's default: each module compiled once and its bytecode kept (.venv and __pycache__, both ignored by git). An
# inherited PYTHONDONTWRITEBYTECODE=1 made every process (test workers, emulators, labs, CLI runs) compile every
# module it imports from source again: `import aws_cdk` 4.7 s of CPU instead of 1.2 s.
unexport PYTHONDONTWRITEBYTECODE

bootstrap:
	@scripts/bootstrap.sh

demo: bootstrap  ## the main job: the local demo
	.venv/bin/delayed-delivery demo $(ARGS)

# Three pytest workers (pytest-xdist; three on 2 CPUs: the workers wait on emulators and queue delays, so a fresh-clone
# CI took 1,470 s with three and 1,901 s with two, both quiet), each file's tests on one worker (every Spark file on the same one, the longest
# first: tests/fixtures/scheduling.py), each worker with its own emulators on free ports; WORKERS=0 runs them in
# this process. Memory: each worker may start moto, Azurite and PostgreSQL; one starts Spark.
WORKERS ?= 3
test: bootstrap  ## every test; emulators are started by the test fixtures
	.venv/bin/python -m pytest -n $(WORKERS) --dist loadfile $(ARGS)

# The second AWS emulator (docs/testing.md): LocalStack (SQS, S3) from its own locked environment, DynamoDB on moto
# server; one pytest process, LocalStack on a free port for the session. The requeue tests, the semantics probes,
# the README's AWS commands and the compressed `aws verify --full`.
LOCALSTACK_TESTS = tests/aws/requeue/test_requeue.py tests/aws/requeue/test_containment.py tests/aws/requeue/test_cancel.py \
	tests/aws/requeue/test_release.py tests/aws/requeue/test_cli.py tests/aws/test_emulator_semantics.py tests/localstack
test-localstack: bootstrap  ## the AWS subset on LocalStack; fails (never skips) in CI when LocalStack cannot start
	@scripts/localstack/bootstrap.sh >/dev/null
	.venv/bin/python -m pytest -n 0 --aws-emulator=localstack $(LOCALSTACK_TESTS) $(ARGS)

lint: bootstrap  ## ruff (lint + format), mypy --strict, import contracts
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	.venv/bin/lint-imports

clean:
	rm -rf .venv .localstack node_modules cdk.out build
