-- The two databases of the distributed stack, owned by role eagle3 (created by entrypoint.sh with its password).
CREATE DATABASE prefect OWNER eagle3;
CREATE DATABASE mlflow OWNER eagle3;
