from langchain_normrank import NormRankVectorStore
from normrank import Weights

texts = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
    "Photosynthesis turns light, water and carbon dioxide into sugar in green plants.",
    "The Great Wall of China stretches across northern China.",
    "Mitochondria produce most of the chemical energy a cell needs.",
]
store = NormRankVectorStore.from_texts(texts, weights=Weights(a=0.02))
retriever = store.as_retriever(search_kwargs={"k": 2})
for doc in retriever.invoke("How do plants turn light into energy?"):
    m = doc.metadata["normrank"]
    print(f"{m['score']:.3f} (cos {m['cosine']:.3f}, g(d) {m['norm_feature']:+.2f})  {doc.page_content}")
