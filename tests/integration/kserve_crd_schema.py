"""The fields of KServe's ServingRuntime (serving.kserve.io/v1alpha1) and InferenceService
(serving.kserve.io/v1beta1) that deploy/kubernetes/kserve.yaml may use, written down from
KServe's published API types (github.com/kserve/kserve, read 2026-11-23):

  pkg/apis/serving/v1alpha1/servingruntime_types.go   ServingRuntimeSpec, SupportedModelFormat,
                                                      ServingRuntimePodSpec, StorageHelper,
                                                      BuiltInAdapter
  pkg/apis/serving/v1beta1/predictor.go               PredictorSpec, PredictorExtensionSpec
  pkg/apis/serving/v1beta1/predictor_model.go         ModelSpec, ModelFormat
  pkg/apis/serving/v1beta1/component.go               ComponentExtensionSpec, ScaleMetric
  pkg/constants/constants.go                          InferenceServiceProtocol values

A schema node is a type name ("string", "bool", "int", "map"), a dict (an object: field ->
node; "!" before a field name marks it required; "*inline" lists Kubernetes model classes whose
JSON fields are inlined, checked by those classes), ("list", node), ("enum", values...), or
("k8s", "V1Container") for a Kubernetes type checked by the client's model classes.
"""

PROTOCOLS = ("enum", "v1", "v2", "grpc-v1", "grpc-v2")

SUPPORTED_MODEL_FORMAT = {
    "!name": "string",
    "version": "string",      # "major", "major.minor" or "major.minor.patch"
    "autoSelect": "bool",
    "priority": "int",        # >= 1, only with autoSelect
}

SERVING_RUNTIME_POD_SPEC = {
    "!containers": ("list", ("k8s", "V1Container")),
    "volumes": ("list", ("k8s", "V1Volume")),
    "nodeSelector": "map",
    "affinity": ("k8s", "V1Affinity"),
    "tolerations": ("list", ("k8s", "V1Toleration")),
    "labels": "map",
    "annotations": "map",
    "imagePullSecrets": ("list", ("k8s", "V1LocalObjectReference")),
    "hostIPC": "bool",
}

SERVING_RUNTIME_SPEC = {
    "supportedModelFormats": ("list", SUPPORTED_MODEL_FORMAT),
    "multiModel": "bool",
    "disabled": "bool",
    "protocolVersions": ("list", PROTOCOLS),
    "workerSpec": dict(SERVING_RUNTIME_POD_SPEC, pipelineParallelSize="int", tensorParallelSize="int"),
    **SERVING_RUNTIME_POD_SPEC,
    # ModelMesh only
    "grpcEndpoint": "string",
    "grpcDataEndpoint": "string",
    "httpDataEndpoint": "string",
    "replicas": "int",
    "storageHelper": {"disabled": "bool"},
    "builtInAdapter": {"serverType": "string", "runtimeManagementPort": "int",
                       "memBufferBytes": "int", "modelLoadingTimeoutMillis": "int",
                       "env": ("list", ("k8s", "V1EnvVar"))},
}

SERVING_RUNTIME = {
    "!apiVersion": ("enum", "serving.kserve.io/v1alpha1"),
    "!kind": ("enum", "ServingRuntime", "ClusterServingRuntime"),
    "!metadata": ("k8s", "V1ObjectMeta"),
    "!spec": SERVING_RUNTIME_SPEC,
}

MODEL_FORMAT = {"!name": "string", "version": "string"}

# PredictorExtensionSpec, with the container's fields inlined.
PREDICTOR_EXTENSION = {
    "storageUri": "string",
    "runtimeVersion": "string",
    "protocolVersion": PROTOCOLS,
    "storage": "map",
    "*inline": ["V1Container"],
}

MODEL_SPEC = {"!modelFormat": MODEL_FORMAT, "runtime": "string", **PREDICTOR_EXTENSION}

COMPONENT_EXTENSION = {
    "minReplicas": "int",
    "maxReplicas": "int",
    "scaleTarget": "int",
    "scaleMetric": ("enum", "cpu", "memory", "concurrency", "rps"),
    "containerConcurrency": "int",
    "timeout": "int",
    "canaryTrafficPercent": "int",
    "logger": "map",
    "batcher": "map",
    "labels": "map",
    "annotations": "map",
    "deploymentStrategy": "map",
}

# The framework-specific predictors (sklearn, onnx, triton, ...) are PredictorExtensionSpecs;
# `model` is the generic one a ServingRuntime is picked for.
PREDICTOR_SPEC = {
    **{k: PREDICTOR_EXTENSION for k in ("sklearn", "xgboost", "tensorflow", "pytorch", "triton",
                                        "onnx", "huggingface", "pmml", "lightgbm", "paddle")},
    "model": MODEL_SPEC,
    "storageUris": ("list", {"!uri": "string", "mountPath": "string"}),
    "workerSpec": "map",
    **COMPONENT_EXTENSION,
    "*inline": ["V1PodSpec"],
}

INFERENCE_SERVICE = {
    "!apiVersion": ("enum", "serving.kserve.io/v1beta1"),
    "!kind": ("enum", "InferenceService"),
    "!metadata": ("k8s", "V1ObjectMeta"),
    "!spec": {"!predictor": PREDICTOR_SPEC, "transformer": "map", "explainer": "map"},
}
