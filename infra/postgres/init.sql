-- Second database for MLflow next to Prefect's (docker-compose.yml runs this on first start).
CREATE DATABASE mlflow OWNER eagle3;
